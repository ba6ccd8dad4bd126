// A chat message's shape as the page holds it: a user message, or a reply with its
// steps and versions (what they mean and how they change: `reply.ts`). Apart from
// store.ts, which maps the server's records to it, so that reply.ts and store.ts both
// read it without importing each other.
import type { Finish } from './finish';

export interface ReplyStats {
  prompt: number | null;
  cached: number | null;
  /** Of `cached`, the tokens read back from the prefix cache's disk tier. */
  cachedDisk?: number | null;
  completion: number;
  reasoning: number | null;
  total: number | null;
  /** True while the counts are live (deltas seen so far), false once the server's usage arrived. */
  live: boolean;
  /** Where the final numbers came from. */
  source: 'stream' | 'ledger' | 'live';
  ttftMs: number | null;
  tokPerS: number | null;
  /** Speculative decoding's draft tokens checked and kept, when the server drafted. */
  drafts?: { checked: number; kept: number } | null;
  /** Of `prompt`, the tokens the prompt's images took (a vision model's). */
  image?: number | null;
}

/** An image sent with a user message: its media type and bytes in base64. */
export interface ImageAttachment {
  mediaType: string;
  data: string;
  /** The file's name, when it had one (shown on hover). */
  name?: string;
}

/** Where a message stands in the store: being written, written, or the write failed. */
export type SaveState = 'pending' | 'saved' | 'failed';

/**
 * A message of a chat. A reply's fields from `ReplyStep` are its shown version's last
 * step's, but `content`, which is the whole version's text (see `reply.ts`).
 */
export interface Message extends ReplyStep {
  /** The UI's key; the server's id as a string for messages loaded from the store. */
  id: string;
  /** The store's id, once written. */
  serverId?: number;
  saved: SaveState;
  role: 'user' | 'assistant';
  /** A reply continued after its token limit: its earlier steps, each with its own usage. */
  steps?: ReplyStep[];
  /** Which version of the reply is shown (0 the first); Regenerate and Edit add one. */
  version?: number;
  /** The user's words this version answered, when that message was edited since. */
  answered?: string;
  /** The reply's other versions, each with its own steps and usage. */
  versions?: ReplyVersion[];
  /** How many of the reply's steps (of every version, in order) the store holds. */
  storedParts?: number;
  /** The tool loop stopped here at the chat's step limit (this many model turns). */
  toolLimit?: number;
}

/** One request's part of a reply (a user message has only its text and time). */
export interface ReplyStep {
  content: string;
  reasoning?: string;
  /** Assistant replies only. */
  responseId?: string;
  model?: string;
  finish?: Finish;
  /** The stop sequence that ended the reply (finish `stop_sequence`), when known. */
  stopSequence?: string;
  error?: string;
  stats?: ReplyStats;
  /** When it was written (ms since the epoch): the store's time, or this page's for a new one. */
  created?: number;
  /** The tools this step's model turn called (MCP), each with the user's answer and its result. */
  tools?: ToolUse[];
  /** The chat turn its request said it served (`x-shoal-turn`); a version's steps share one. */
  turn?: string;
  /** A user message's images, in the order sent. */
  images?: ImageAttachment[];
}

/**
 * A tool call the model made in a step, and what became of it: waiting for the
 * user (`asking`), running, answered (`done`), refused by the user (`denied`), or
 * failed (a server that hung or died; the model reads the error). `skipped`: the
 * loop ended first (Stop, or the step limit).
 */
export interface ToolUse {
  /** The model's call id, which the tool's message answers. */
  id: string;
  /** The function name the model called (`server__tool`). */
  name: string;
  /** The arguments as the model wrote them (JSON text). */
  arguments: string;
  state: 'asking' | 'running' | 'done' | 'denied' | 'failed' | 'skipped';
  /** The server marks it read-only (a hint). */
  readOnly?: boolean;
  /** Allowed without asking (read-only, or always allowed for this tool). */
  auto?: boolean;
  /** What the model reads back: the result, or why there is none. */
  result?: string;
  isError?: boolean;
  truncated?: boolean;
  /** The tool's own time, apart from the model's. */
  tookMs?: number;
}

/** A version of a reply other than the one shown. */
export interface ReplyVersion {
  version: number;
  /** The user's words it answered, when that message was edited since. */
  answered?: string;
  steps: ReplyStep[];
}
