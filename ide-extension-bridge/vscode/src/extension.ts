// The nib VS Code extension: starts `nib lsp` and lets VS Code's language client do the rest.
// Inline ("ghost text") completions come from the bridge's textDocument/inlineCompletion
// (LSP 3.18), which vscode-languageclient wires to VS Code's inline completion API.

import * as vscode from "vscode";
import {
  LanguageClient,
  LanguageClientOptions,
  ServerOptions,
  TransportKind,
} from "vscode-languageclient/node";

const SECTION = "nib";
// Settings the bridge understands; the rest of the section configures the extension.
const BRIDGE_KEYS = ["address", "apiKey", "tls", "caFile", "maxTokens", "debounceMs", "mode"];

let client: LanguageClient | undefined;

function bridgeSettings(): Record<string, unknown> {
  const config = vscode.workspace.getConfiguration(SECTION);
  const settings: Record<string, unknown> = {};
  for (const key of BRIDGE_KEYS) {
    const value = config.get<unknown>(key);
    if (value !== undefined && value !== null) {
      settings[key] = value;
    }
  }
  return settings;
}

function serverOptions(): ServerOptions {
  const [command, ...args] = vscode.workspace
    .getConfiguration(SECTION)
    .get<string[]>("command", ["nib", "lsp"]);
  return { command, args, transport: TransportKind.stdio };
}

async function start(context: vscode.ExtensionContext): Promise<void> {
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    initializationOptions: bridgeSettings(),
    outputChannelName: "nib",
  };
  client = new LanguageClient("nib", "nib", serverOptions(), clientOptions);
  await client.start();
  context.subscriptions.push(
    vscode.workspace.onDidChangeConfiguration(async (event) => {
      if (client === undefined || !event.affectsConfiguration(SECTION)) {
        return;
      }
      if (event.affectsConfiguration(`${SECTION}.command`)) {
        await restart(context);
        return;
      }
      // Pushed in the shape the bridge accepts: { nib: { ... } }.
      await client.sendNotification("workspace/didChangeConfiguration", {
        settings: { [SECTION]: bridgeSettings() },
      });
    }),
  );
}

async function restart(context: vscode.ExtensionContext): Promise<void> {
  if (client !== undefined) {
    await client.stop();
    client = undefined;
  }
  await start(context);
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  context.subscriptions.push(
    vscode.commands.registerCommand("nib.restart", () => restart(context)),
    vscode.commands.registerCommand("nib.status", async () => {
      if (client === undefined) {
        void vscode.window.showWarningMessage("nib: the language server is not running.");
        return;
      }
      const status = await client.sendRequest("workspace/executeCommand", {
        command: "nib.status",
        arguments: [],
      });
      void vscode.window.showInformationMessage(`nib: ${JSON.stringify(status)}`);
    }),
  );
  await start(context);
}

export async function deactivate(): Promise<void> {
  if (client !== undefined) {
    await client.stop();
  }
}
