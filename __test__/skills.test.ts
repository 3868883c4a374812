// TrueForge's skill init, as the server runs it, in a sandbox on the TrueForge-ready image
// (trueforge-sandbox:2), as its non-root user `agent`, without network: the sandbox directories,
// a git skill downloader written against the pydantic v2 API (the server uploads its own to
// getGitDownloaderPath and runs it with python3), then the tools TrueForge's exec tool
// description promises the agent. The same downloader on the Debian 12 image (pydantic 1.10)
// dies with the ImportError issue #9 is about.

import { DockerSandboxProvider } from '..'
import { DEBIAN, ok, run, SandboxTracker, TRUEFORGE, uniqueNamespace } from './helpers'

jest.setTimeout(90_000)

const namespace = uniqueNamespace('t-skills')
const tracker = new SandboxTracker(namespace)
const provider = new DockerSandboxProvider({ image: TRUEFORGE, namespace, network: 'none' })

// A downloader in the style of TrueForge's: the skill list comes base64-encoded JSON in
// AGENT_GIT_SKILLS, is validated with pydantic v2 models, and each skill's subdirectory is
// materialised from a git clone. Written for this test; not TrueForge's script.
const DOWNLOADER = `#!/usr/bin/env python3
import base64, json, os, shutil, subprocess, sys, tempfile
from pathlib import Path
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

class GitSkill(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    url: str
    path: str = ""
    ref: str = "HEAD"

    @field_validator("name")
    @classmethod
    def plain_name(cls, v: str) -> str:
        if "/" in v or v.startswith("."):
            raise ValueError("a skill name is one path segment")
        return v

def main() -> int:
    raw = os.environ.get("AGENT_GIT_SKILLS", "")
    try:
        items = json.loads(base64.b64decode(raw)) if raw else []
        skills = [GitSkill.model_validate(i) for i in items]
    except ValidationError as e:
        print("invalid skills:", e.errors()[0]["loc"], file=sys.stderr)
        return 2
    root = Path(sys.argv[1])
    root.mkdir(parents=True, exist_ok=True)
    done = []
    for s in skills:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(["git", "clone", "--quiet", s.url, tmp + "/c"], check=True)
            subprocess.run(["git", "-C", tmp + "/c", "checkout", "--quiet", s.ref], check=True)
            dest = root / s.name
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(Path(tmp, "c", s.path), dest)
        done.append(s.name)
    print(json.dumps({"installed": done}))
    return 0

sys.exit(main())
`

const b64 = (v: unknown) => Buffer.from(JSON.stringify(v)).toString('base64')

let id: string

beforeAll(async () => {
  id = await tracker.create(provider)
})

afterAll(async () => {
  await tracker.cleanup(provider)
  provider.dispose()
})

test('the skill init runs as agent: sandbox dirs, the pydantic v2 downloader, empty and real skill lists', async () => {
  expect((await ok(provider, id, 'id -un')).trim()).toBe('agent')
  const skills = provider.getSkillsDir(id)
  const downloader = provider.getGitDownloaderPath(id)
  await ok(
    provider,
    id,
    `mkdir -p '${provider.getFileUploadsDir(id)}' '${skills}' '${provider.getToolResultDumpDir(id)}'`,
  )
  await provider.uploadFile({ sandboxId: id, remotePath: downloader, content: Buffer.from(DOWNLOADER) })
  await ok(provider, id, `chmod 0555 '${downloader}'`)

  // An empty skill list: this is where the Debian 12 images died.
  expect(await ok(provider, id, `python3 '${downloader}' '${skills}'`, { env: { AGENT_GIT_SKILLS: '' } })).toBe(
    '{"installed": []}\n',
  )

  // A real skill from a git repository (a local one: the sandbox has no network).
  await ok(
    provider,
    id,
    [
      'set -e',
      'mkdir -p repo/skills/hello && cd repo',
      'git init --quiet -b main',
      "printf '# hello skill\\n' > skills/hello/SKILL.md",
      "printf 'other\\n' > README.md",
      'git add -A',
      'git -c user.email=t@example.invalid -c user.name=t commit --quiet -m one',
    ].join('\n'),
  )
  const list = [{ name: 'hello', url: `${id}/repo`, path: 'skills/hello', ref: 'main' }]
  expect(await ok(provider, id, `python3 '${downloader}' '${skills}'`, { env: { AGENT_GIT_SKILLS: b64(list) } })).toBe(
    '{"installed": ["hello"]}\n',
  )
  expect(
    await ok(provider, id, `cat '${skills}/hello/SKILL.md'; ls -A '${skills}/hello'; stat -c %U '${skills}/hello'`),
  ).toBe('# hello skill\nSKILL.md\nagent\n')

  // The field validator and extra="forbid" really run (pydantic v2 semantics).
  for (const bad of [[{ name: '../x', url: 'u' }], [{ name: 'x', url: 'u', extra: 1 }]]) {
    const r = await run(provider, id, `python3 '${downloader}' '${skills}'`, { env: { AGENT_GIT_SKILLS: b64(bad) } })
    expect(r.exitCode).toBe(2)
    expect(r.result).toMatch(/^invalid skills: /)
  }
})

test('the tools the exec tool promises work as agent: genson, git, rg, jq, tree, zip/unzip, curl, requests, aiohttp', async () => {
  await ok(provider, id, `mkdir -p tools && printf '{"name": "a", "tags": ["x"], "n": 3}' > tools/file.json`)
  const schema = JSON.parse(await ok(provider, id, 'cd tools && genson file.json'))
  expect(schema).toMatchObject({
    $schema: expect.stringContaining('json-schema.org'),
    type: 'object',
    properties: {
      name: { type: 'string' },
      tags: { type: 'array', items: { type: 'string' } },
      n: { type: 'integer' },
    },
  })
  expect(await ok(provider, id, 'genson --version')).toMatch(/^genson 1\.4\.0/)
  expect(await ok(provider, id, 'git --version')).toMatch(/^git version 2\.47\./)
  expect(await ok(provider, id, 'rg -n needle tools/file.json || echo none; rg -c name tools/file.json')).toBe(
    'none\n1\n',
  )
  expect((await ok(provider, id, 'jq -c ".tags + [.n]" tools/file.json')).trim()).toBe('["x",3]')
  expect(await ok(provider, id, 'tree --noreport tools')).toBe('tools\n└── file.json\n')
  expect(
    await ok(
      provider,
      id,
      'cd tools && zip -q -r ../t.zip . && mkdir ../out && cd ../out && unzip -q ../t.zip && cmp file.json ../tools/file.json && echo same',
    ),
  ).toBe('same\n')
  expect(await ok(provider, id, 'curl --version')).toMatch(/^curl 8\./)
  expect(
    (
      await ok(
        provider,
        id,
        `python3 -c 'import requests, aiohttp, genson; print(requests.__version__, aiohttp.__version__)'`,
      )
    ).trim(),
  ).toBe('2.34.2 3.14.5')
})

test('the same downloader on the Debian 12 image (pydantic 1.10) dies at import: the failure of issue #9', async () => {
  const debianNamespace = uniqueNamespace('t-skills-deb')
  const debian = new DockerSandboxProvider({ image: DEBIAN, namespace: debianNamespace, network: 'none' })
  const debianSandboxes = new SandboxTracker(debianNamespace)
  try {
    const did = await debianSandboxes.create(debian)
    const downloader = debian.getGitDownloaderPath(did)
    await debian.uploadFile({ sandboxId: did, remotePath: downloader, content: Buffer.from(DOWNLOADER) })
    const r = await run(debian, did, `python3 '${downloader}' /tmp/skills`, { env: { AGENT_GIT_SKILLS: '' } })
    expect(r.exitCode).toBe(1)
    expect(r.result).toMatch(/ImportError: cannot import name 'field_validator' from 'pydantic'/)
  } finally {
    await debianSandboxes.cleanup(debian)
    debian.dispose()
  }
})
