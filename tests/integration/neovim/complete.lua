-- Headless Neovim as the bridge's LSP client: open a file, attach `nib lsp`, ask for a
-- completion at a cursor, write the answer (or the error) as JSON, quit.
-- Inputs (environment): NIB_LSP_CMD (JSON list), NIB_ADDRESS, NIB_FILE, NIB_LINE,
-- NIB_CHARACTER (0-based, as LSP counts), NIB_OUT (where the JSON goes).

local function write(value)
  local f = assert(io.open(os.getenv("NIB_OUT"), "w"))
  f:write(vim.fn.json_encode(value))
  f:close()
end

local function run()
  local file = os.getenv("NIB_FILE")
  vim.cmd("edit " .. vim.fn.fnameescape(file))
  local buf = vim.api.nvim_get_current_buf()
  local initialized = false
  local client_id = vim.lsp.start_client({
    name = "nib",
    cmd = vim.fn.json_decode(os.getenv("NIB_LSP_CMD")),
    root_dir = vim.fn.fnamemodify(file, ":h"),
    init_options = {
      address = os.getenv("NIB_ADDRESS"),
      debounceMs = 0,
      maxTokens = 16,
      mode = "single",
    },
    on_init = function()
      initialized = true
    end,
  })
  assert(client_id, "the language server did not start")
  vim.lsp.buf_attach_client(buf, client_id)
  assert(vim.wait(30000, function() return initialized end, 20), "no initialize answer")
  local params = {
    textDocument = { uri = vim.uri_from_bufnr(buf) },
    position = { line = tonumber(os.getenv("NIB_LINE")), character = tonumber(os.getenv("NIB_CHARACTER")) },
  }
  local answers, err = vim.lsp.buf_request_sync(buf, "textDocument/completion", params, 60000)
  assert(answers, "no answer: " .. tostring(err))
  local answer = answers[client_id]
  assert(answer and not answer.err, "error: " .. vim.inspect(answer))
  write({ filetype = vim.bo[buf].filetype, result = answer.result })
  vim.lsp.stop_client(client_id)
end

local ok, problem = pcall(run)
if not ok then
  write({ error = tostring(problem) })
end
vim.cmd("qa!")
