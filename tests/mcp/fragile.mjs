#!/usr/bin/env node
// A small stdio MCP server for the failure cases the reference server has
// no tool for: `crash` exits while its call is in flight (after a line on
// stderr), `hang` never answers, `calls` counts the calls this process
// answered (a fresh process starts again at 1).
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import { z } from "zod";

const server = new McpServer({ name: "fragile", version: "1.0.0" });
let calls = 0;

server.registerTool(
  "crash",
  { description: "Exits while the call is in flight", inputSchema: {} },
  async () => {
    console.error("fragile: crashing on purpose");
    process.exit(3);
  },
);
server.registerTool(
  "hang",
  { description: "Never answers", inputSchema: { note: z.string().optional() } },
  () => new Promise(() => {}),
);
server.registerTool(
  "calls",
  {
    description: "How many calls this process has answered",
    inputSchema: {},
    annotations: { readOnlyHint: true },
  },
  async () => {
    calls += 1;
    return { content: [{ type: "text", text: String(calls) }] };
  },
);

await server.connect(new StdioServerTransport());
