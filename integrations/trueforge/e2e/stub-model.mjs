// A scripted OpenAI-compatible chat-completions endpoint on loopback, for driving real TrueForge
// turns without a model. TrueForge reaches it as a `custom` model provider.
//
// Each user message carries its script: `RUN: <shell command>` makes the model call the sandbox's
// `exec` tool with that command; once a tool result is the last message, the model answers with
// a final text that quotes it. Anything else gets a plain answer. Replies stream as SSE, the way
// the OpenAI API streams (a role chunk, content or tool-call deltas, a finish chunk, `[DONE]`).

import { createServer } from 'node:http'

function textOf(content) {
  if (typeof content === 'string') return content
  if (Array.isArray(content)) return content.map((part) => (typeof part?.text === 'string' ? part.text : '')).join('')
  return ''
}

/** What the model does for one request: call a tool, or answer. */
export function decide(body) {
  const messages = Array.isArray(body?.messages) ? body.messages : []
  const last = messages[messages.length - 1]
  const tools = Array.isArray(body?.tools) ? body.tools.map((t) => t?.function?.name).filter(Boolean) : []
  if (last?.role === 'tool') {
    return { kind: 'text', text: `DONE ${textOf(last.content).slice(0, 2000)}` }
  }
  const lastUser = [...messages].reverse().find((m) => m?.role === 'user')
  const match = /RUN: ([\s\S]+)$/.exec(textOf(lastUser?.content).trim())
  const exec = tools.find((name) => name === 'exec' || name.endsWith('exec'))
  if (match && exec) {
    return { kind: 'tool', tool: exec, args: { intent: 'Run the requested command', command: match[1].trim() } }
  }
  return { kind: 'text', text: 'OK' }
}

function chunk(id, model, delta, finish = null) {
  return `data: ${JSON.stringify({
    id,
    object: 'chat.completion.chunk',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, delta, finish_reason: finish }],
  })}\n\n`
}

/** Starts the stub; resolves to { url, requests, close }. `requests` records every decision. */
export function startStubModel() {
  const requests = []
  let calls = 0
  const server = createServer((req, res) => {
    let raw = ''
    req.setEncoding('utf8')
    req.on('data', (d) => (raw += d))
    req.on('end', () => {
      if (req.method !== 'POST' || !req.url.endsWith('/chat/completions')) {
        res.writeHead(404, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { message: `no route ${req.method} ${req.url}` } }))
        return
      }
      let body
      try {
        body = JSON.parse(raw)
      } catch {
        res.writeHead(400).end()
        return
      }
      const decision = decide(body)
      requests.push({ at: Date.now(), messages: body.messages, decision })
      const id = `chatcmpl-stub-${++calls}`
      const model = body.model ?? 'stub'
      if (body.stream === false) {
        const message =
          decision.kind === 'tool'
            ? {
                role: 'assistant',
                content: null,
                tool_calls: [
                  {
                    id: `call_${calls}`,
                    type: 'function',
                    function: { name: decision.tool, arguments: JSON.stringify(decision.args) },
                  },
                ],
              }
            : { role: 'assistant', content: decision.text }
        res.writeHead(200, { 'content-type': 'application/json' })
        res.end(
          JSON.stringify({
            id,
            object: 'chat.completion',
            created: Math.floor(Date.now() / 1000),
            model,
            choices: [{ index: 0, message, finish_reason: decision.kind === 'tool' ? 'tool_calls' : 'stop' }],
            usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 },
          }),
        )
        return
      }
      res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' })
      res.write(chunk(id, model, { role: 'assistant', content: '' }))
      if (decision.kind === 'tool') {
        res.write(
          chunk(id, model, {
            tool_calls: [
              { index: 0, id: `call_${calls}`, type: 'function', function: { name: decision.tool, arguments: '' } },
            ],
          }),
        )
        res.write(
          chunk(id, model, { tool_calls: [{ index: 0, function: { arguments: JSON.stringify(decision.args) } }] }),
        )
        res.write(chunk(id, model, {}, 'tool_calls'))
      } else {
        res.write(chunk(id, model, { content: decision.text }))
        res.write(chunk(id, model, {}, 'stop'))
      }
      res.write(
        `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: Math.floor(Date.now() / 1000), model, choices: [], usage: { prompt_tokens: 10, completion_tokens: 5, total_tokens: 15 } })}\n\n`,
      )
      res.end('data: [DONE]\n\n')
    })
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      resolve({
        url: `http://127.0.0.1:${port}/v1`,
        requests,
        close: () => new Promise((r) => server.close(() => r())),
      })
    })
  })
}
