// The server's MCP servers (its mcp.json): each one's state and tool count, the
// file itself to edit, and the "Always allow" answers the server keeps (each server's
// `alwaysAllow` in the file).
import { createResource, createSignal, For, Show } from 'solid-js';
import { mcpConfig, mcpServers, setMcpConfig } from '../api';
import { forgetAllowedTools } from '../chatState';

export function McpSettings() {
  const [servers, { refetch }] = createResource(mcpServers);
  const [file, { mutate }] = createResource(mcpConfig);
  const [text, setText] = createSignal<string | null>(null);
  const [problem, setProblem] = createSignal<string | null>(null);
  const [saved, setSaved] = createSignal(false);
  const [forgot, setForgot] = createSignal<number | null>(null);
  const forget = async () => {
    setProblem(null);
    try {
      const n = await forgetAllowedTools();
      // The file shown loses its alwaysAllow lists too, before the note says so.
      mutate(await mcpConfig());
      setText(null);
      setForgot(n);
    } catch (e) {
      setProblem((e as Error).message);
    }
  };
  const shown = () => text() ?? JSON.stringify(file() ?? { mcpServers: {} }, null, 2);
  const save = async () => {
    setProblem(null);
    setSaved(false);
    let parsed: unknown;
    try {
      parsed = JSON.parse(shown());
    } catch (e) {
      setProblem(`Not valid JSON: ${(e as Error).message}`);
      return;
    }
    try {
      mutate(await setMcpConfig(parsed));
      setText(null);
      setSaved(true);
      void refetch();
    } catch (e) {
      setProblem((e as Error).message);
    }
  };
  return (
    <fieldset class="card mcp-settings" data-testid="mcp-settings">
      <legend>Tools from MCP servers</legend>
      <p class="muted">
        A chat offers these servers' tools to its model when its settings say so, and asks you before each call.
        Stdio servers run as you, with only <code>PATH</code>, <code>HOME</code> and the <code>env</code> their entry gives.
      </p>
      <Show when={servers()} fallback={<span class="muted">{servers.error ? `Unavailable: ${servers.error.message}` : 'Starting the servers…'}</span>}>
        {(list) => (
          <>
            <Show when={list().data.length === 0}>
              <p class="muted" data-testid="mcp-none">No MCP servers yet: add them to the file below.</p>
            </Show>
            <ul class="mcp-servers">
              <For each={list().data}>
                {(sv) => (
                  <li data-testid="mcp-server" data-name={sv.name} data-state={sv.state}>
                    <strong>{sv.name}</strong> <span class="muted">({sv.transport})</span>{' '}
                    <span class="tag" classList={{ warn: sv.state === 'failed' }}>
                      {sv.state === 'ready' ? `${sv.tools} tools` : sv.state}
                    </span>
                    <Show when={sv.error}>
                      <div class="error-text small" data-testid="mcp-server-error">{sv.error}</div>
                    </Show>
                  </li>
                )}
              </For>
            </ul>
            <p class="muted small">
              {list().path ? <>Kept in <code>{list().path}</code>. </> : null}
              A call may take {list().timeout_secs} s; the model reads at most {list().max_result_chars} characters of a result.
            </p>
          </>
        )}
      </Show>
      <label class="field">
        <span>mcp.json (the layout Cursor and Claude Desktop use)</span>
        <textarea
          data-testid="mcp-config"
          rows={8}
          spellcheck={false}
          value={shown()}
          onInput={(e) => {
            setText(e.currentTarget.value);
            setSaved(false);
          }}
        />
      </label>
      <div class="row">
        <button class="btn small" data-testid="mcp-save" onClick={() => void save()}>
          Save and restart changed servers
        </button>
        <button class="btn small ghost" data-testid="mcp-refresh" onClick={() => void refetch()}>
          Refresh
        </button>
        <button
          class="btn small ghost"
          data-testid="mcp-forget"
          title="Tools you allowed with “Always” ask again (the alwaysAllow lists in the file)"
          onClick={() => void forget()}
        >
          Forget “Always allow” answers
        </button>
      </div>
      <Show when={problem()}>
        <p class="warn" role="alert" data-testid="mcp-config-error">{problem()}</p>
      </Show>
      <Show when={saved()}>
        <p class="muted" data-testid="mcp-saved">Saved.</p>
      </Show>
      <Show when={forgot() != null}>
        <p class="muted" data-testid="mcp-forgot">
          {forgot() === 0 ? 'No tool was always allowed.' : `Forgot ${forgot()} “Always allow” ${forgot() === 1 ? 'answer' : 'answers'}: those tools ask again.`}
        </p>
      </Show>
    </fieldset>
  );
}
