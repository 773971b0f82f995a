"""nib's editor bridge: a Language Server (`nib lsp`) that completes code as you type.

It serves textDocument/inlineCompletion and textDocument/completion from a nib
server through the SDK, and needs only the base install (no torch).
"""
