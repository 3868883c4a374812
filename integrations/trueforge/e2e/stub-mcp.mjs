// A minimal MCP server on loopback (Streamable HTTP transport, JSON responses), with one
// read-only tool, `shout`, that upper-cases its `text`. TrueForge connects to it as a configured
// remote MCP server; a sandbox command reaches it through Code Mode (`mcp-client call-tool`).

import { createServer } from 'node:http'

const TOOL = {
  name: 'shout',
  description: 'Returns the given text in upper case.',
  inputSchema: {
    type: 'object',
    properties: { text: { type: 'string', description: 'Text to upper-case.' } },
    required: ['text'],
  },
  annotations: { readOnlyHint: true, destructiveHint: false },
}

/** Starts the stub; resolves to { url, calls, close }. `calls` records every tools/call. */
export function startStubMcp() {
  const calls = []
  const server = createServer((req, res) => {
    const path = req.url.split('?')[0]
    if (path !== '/mcp') {
      res.writeHead(404, { 'content-type': 'application/json' }).end('{}')
      return
    }
    if (req.method === 'DELETE') {
      res.writeHead(200).end()
      return
    }
    if (req.method !== 'POST') {
      // No server-initiated stream: the client then talks request/response only.
      res.writeHead(405, { allow: 'POST, DELETE' }).end()
      return
    }
    let raw = ''
    req.setEncoding('utf8')
    req.on('data', (d) => (raw += d))
    req.on('end', () => {
      let message
      try {
        message = JSON.parse(raw)
      } catch {
        res.writeHead(400).end()
        return
      }
      const batch = Array.isArray(message) ? message : [message]
      const replies = batch.filter((m) => m && m.id !== undefined).map((m) => reply(m, calls))
      if (replies.length === 0) {
        res.writeHead(202).end()
        return
      }
      res.writeHead(200, { 'content-type': 'application/json', 'mcp-session-id': 'stub-session' })
      res.end(JSON.stringify(Array.isArray(message) ? replies : replies[0]))
    })
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      resolve({ url: `http://127.0.0.1:${port}/mcp`, calls, close: () => new Promise((r) => server.close(() => r())) })
    })
  })
}

function reply(message, calls) {
  const { id, method, params } = message
  const ok = (result) => ({ jsonrpc: '2.0', id, result })
  switch (method) {
    case 'initialize':
      return ok({
        protocolVersion: params?.protocolVersion ?? '2025-06-18',
        capabilities: { tools: { listChanged: false } },
        serverInfo: { name: 'trueforge-docker-sandbox-stub', version: '1.0.0' },
      })
    case 'ping':
      return ok({})
    case 'tools/list':
      return ok({ tools: [TOOL] })
    case 'tools/call': {
      const text = String(params?.arguments?.text ?? '')
      calls.push({ at: Date.now(), name: params?.name, arguments: params?.arguments })
      if (params?.name !== TOOL.name) {
        return ok({ isError: true, content: [{ type: 'text', text: `unknown tool ${params?.name}` }] })
      }
      const shouted = text.toUpperCase()
      return ok({ content: [{ type: 'text', text: JSON.stringify({ shouted }) }], structuredContent: { shouted } })
    }
    default:
      return { jsonrpc: '2.0', id, error: { code: -32601, message: `method not found: ${method}` } }
  }
}
