// Why a reply ended: the badge shown under it, and what to do about it.

export type Finish =
  | 'stop'
  | 'stop_sequence'
  | 'length'
  | 'tool_calls'
  | 'content_filter'
  | 'cancelled'
  | 'error';

export const FINISH: Record<Finish, { label: string; tone: 'ok' | 'warn' | 'bad' | 'info'; help: string }> = {
  stop: {
    label: 'stop',
    tone: 'ok',
    help: 'The model ended the reply itself (end of turn). Nothing to do.',
  },
  stop_sequence: {
    label: 'stop sequence',
    tone: 'info',
    help: 'One of this chat\'s stop sequences appeared, so the reply was cut just before it (the sequence itself is not shown). Remove or change the stop sequences in the chat settings to let it continue.',
  },
  length: {
    label: 'length',
    tone: 'warn',
    help: 'The reply hit the max tokens limit (or the context window) and was cut off. Continue carries it on; or raise max tokens in the chat settings, or start a new chat if the conversation fills the context window.',
  },
  tool_calls: {
    label: 'tool calls',
    tone: 'info',
    help: 'The model asked to call a tool. With tools on in the chat settings, each call waits for your Allow under the reply and the model carries on with its result; without them nothing runs, so rephrase the request.',
  },
  content_filter: {
    label: 'content filter',
    tone: 'warn',
    help: 'The server\'s content filter (--block / --block-regex) matched and withheld the rest of the reply. Rephrase the request or change the server\'s filter.',
  },
  cancelled: {
    label: 'cancelled',
    tone: 'warn',
    help: 'You pressed Stop; the server cancelled the generation. The text so far is kept. Send again to get a full reply.',
  },
  error: {
    label: 'error',
    tone: 'bad',
    help: 'The server refused the request or failed while generating; its message is shown above. Fix the setting it names (for example max tokens) and send again.',
  },
};

export function finishFromApi(reason: string | null | undefined): Finish {
  switch (reason) {
    case 'stop':
    case 'length':
    case 'tool_calls':
    case 'content_filter':
    case 'stop_sequence':
    case 'cancelled':
    case 'error':
      return reason;
    case 'end_turn':
      return 'stop';
    case 'max_tokens':
    // Anthropic's word for a reply that filled the context window.
    case 'model_context_window_exceeded':
      return 'length';
    // The engine's word for a reply the server's time limit stopped.
    case 'timeout':
      return 'error';
    default:
      return 'stop';
  }
}

