"""LSP bridge (see issue: IDE bridge). Placeholder package so the namespace is complete."""
