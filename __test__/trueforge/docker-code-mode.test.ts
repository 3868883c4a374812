// Code Mode through TrueForge's real Sandbox class over DockerSandboxProvider: the turn configures
// Code Mode with an MCP tool set, the agent's commands call its tools with `mcp-client` and the
// Python API, TrueForge's own CodeModeDispatcher does the routing, and closing the turn ends the
// relay. Runs inside a TrueForge checkout (see scripts/ci/test-trueforge.sh).

import { isCallToolResponseResult, type IToolSet } from '../../src/core/mcp/IMCPServer'
import { SANDBOX_EXEC_TOOL_NAME, Sandbox } from '../../src/core/sandbox/Sandbox'
import * as sandboxErrors from '../../src/core/sandbox/SandboxErrors'
import { rawSandboxId } from '../../src/core/sandbox/sandboxRef'
import { containersLeft, type DockerProvider, runNamespace, silentLogger, Tracker, turnSandbox } from './support'

jest.setTimeout(180_000)

const namespace = runNamespace('tfcm')
const tracker = new Tracker(namespace)

/** An MCP server as the turn sees it: one read-only tool and one destructive one. */
class DemoTools {
  readonly name = 'demo'
  readonly id = 'demo'
  readonly preload = true
  readonly hasPreloadedTools = false
  readonly calls: { name: string; arguments?: Record<string, unknown> }[] = []

  async listTools(): Promise<any> {
    return {
      result: {
        tools: [
          {
            name: 'echo',
            description: 'Echoes its arguments',
            inputSchema: { type: 'object' },
            annotations: { readOnlyHint: true },
          },
          {
            name: 'wipe',
            description: 'Deletes everything',
            inputSchema: { type: 'object' },
            annotations: { destructiveHint: true },
          },
        ],
      },
      wasInitialized: undefined,
    }
  }

  async callTool(params: { name: string; arguments?: Record<string, unknown> }): Promise<any> {
    this.calls.push(params)
    return {
      result: { content: [{ type: 'text', text: JSON.stringify({ echoed: params.arguments ?? {} }) }] },
      wasInitialized: undefined,
    }
  }

  async toolCallInfo(): Promise<any> {
    throw new Error('not used by Code Mode')
  }

  getAllowedToolNamesForSandbox(): string[] {
    return ['echo', 'wipe']
  }
}

async function agentExec(
  sandbox: Sandbox,
  command: string,
): Promise<{ exitCode: number; out: string; sessionId?: string | undefined }> {
  const r = await sandbox.callTool({ name: SANDBOX_EXEC_TOOL_NAME, arguments: { intent: 'test', command } })
  if (!isCallToolResponseResult(r)) throw new Error(`expected a tool result, got ${JSON.stringify(r)}`)
  const text = (r.result.content[0] as { text?: string }).text ?? ''
  const parsed = JSON.parse(text)
  if (!parsed.success) throw new Error(`exec did not run: ${parsed.error}`)
  return { exitCode: parsed.response.exitCode, out: parsed.response.result, sessionId: r.sandboxInfo?.sandbox_id }
}

/** Code Mode sockets served in the sandbox (by the agent, or by a Python relay each). */
const relays = (provider: DockerProvider, sandboxId: string) =>
  provider.exec({
    sandboxId,
    command: `ls /trueforge/codemode/run 2>/dev/null | grep '\\.sock$' | wc -l`,
  })

afterAll(async () => {
  await tracker.cleanup()
  expect(containersLeft(namespace)).toBe(0)
}, 120_000)

test('a turn with an MCP server: the agent calls its tools from the sandbox; closing the turn ends the relay', async () => {
  const provider = tracker.provider({ tenantName: 'acme', errors: sandboxErrors, logger: silentLogger() })
  const tools = new DemoTools()
  const sandbox = turnSandbox(provider)
  sandbox.configureCodeMode([tools as unknown as IToolSet])

  const cli = await agentExec(sandbox, `cd / && mcp-client call-tool demo echo '{"x":1}'`)
  expect(cli.exitCode).toBe(0)
  expect(JSON.parse(cli.out)).toEqual({ echoed: { x: 1 } })
  expect(tools.calls).toEqual([{ name: 'echo', arguments: { x: 1 } }])

  const py = await agentExec(
    sandbox,
    `cd /tmp && python3 -c 'import asyncio, json; from mcp_client import call_tool; print(json.dumps(asyncio.run(call_tool("demo", "echo", body={"y": 2}))))'`,
  )
  expect(py.exitCode).toBe(0)
  expect(JSON.parse(py.out)).toEqual({ echoed: { y: 2 } })

  const wipe = await agentExec(sandbox, `mcp-client call-tool demo wipe '{}'`)
  expect(wipe.exitCode).not.toBe(0)
  expect(wipe.out).toMatch(/destructive/)
  expect(tools.calls.map((c) => c.name)).toEqual(['echo', 'echo'])

  const raw = rawSandboxId(cli.sessionId!)
  expect(await relays(provider, raw)).toEqual({ success: true, response: { exitCode: 0, result: '1\n' } })
  await sandbox.close()
  expect(await relays(provider, raw)).toEqual({ success: true, response: { exitCode: 0, result: '0\n' } })
})
