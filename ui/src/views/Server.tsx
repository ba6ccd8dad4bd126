// The server's own settings, for every chat and every client: a page of their own, apart from a
// chat's settings (a switch that changes what other tools see does not belong to one chat).
import { McpSettings } from '../components/McpSettings';
import { ServerSettings } from '../components/ServerSettings';

export function ServerView() {
  return (
    <div class="page server-page" data-testid="server-view">
      <h2>Server</h2>
      <p class="muted">What these change holds for every chat and every client of this server.</p>
      <ServerSettings />
      <McpSettings />
    </div>
  );
}
