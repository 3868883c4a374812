// Type-checks and tests the settings-UI part of the patch series (packages/trueforge-ui) without
// installing that package's locked dependencies, which the registry no longer serves in full
// (@assistant-ui/core 0.2.22, @truefoundry/assistant-ui-runtime 0.1.21).
//
//   node run.mjs --trueforge <TrueForge tree with the series applied> --runtime <runtime source>
//                [--tools <dir>] [--report <file.json>] [--patches <dir>]
//
// --runtime is a checkout or export of truefoundry/truefoundry-agents-assistant-ui-runtime at the
// tag the lock names (v0.1.21): its public source stands in for the unpublished package, through
// `paths` (tsc) and aliases (vitest). The SDK is the tree's own packages/trueforge-sdk (patched by
// the series): its declarations are built for tsc and its source is aliased for vitest. Test tools
// and the UI's served dependencies are installed once into --tools (npm). Nothing is written into
// the runtime checkout (its source is copied), nor into the tree except a node_modules link in
// packages/trueforge-ui, removed at the end.
//
// 1. tsc --noEmit, with a tsconfig that extends the UI's own (strict, noUncheckedIndexedAccess,
//    verbatimModuleSyntax), over the UI files the series changes, plus a canary file whose
//    `@ts-expect-error` lines fail if the runtime's or the SDK's types are not the real ones.
//    Errors in the series' files fail the check, except "cannot find module" for a module the
//    registry does not serve; errors elsewhere in the package are counted and listed by module.
// 2. vitest (jsdom, the UI's own test setup) over the UI test files the series changes.
// 3. eslint with the UI's own config over the same files as tsc (no error and no warning).

import { execFileSync, spawnSync } from 'node:child_process'
import {
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join, relative, resolve } from 'node:path'
import { fileURLToPath } from 'node:url'

const here = dirname(fileURLToPath(import.meta.url))

function arg(name, fallback) {
  const i = process.argv.indexOf(`--${name}`)
  if (i !== -1 && process.argv[i + 1] !== undefined) return process.argv[i + 1]
  if (fallback !== undefined) return fallback
  throw new Error(`--${name} is required`)
}
const tree = resolve(arg('trueforge'))
const runtimeArg = resolve(arg('runtime'))
const tools = resolve(
  arg(
    'tools',
    join(
      process.env.XDG_CACHE_HOME ?? join(process.env.HOME ?? tmpdir(), '.cache'),
      'trueforge-docker-sandbox/tools/ui-check',
    ),
  ),
)
const reportFile = arg('report', '')
// The series whose UI files are checked (default: this repository's).
const patchesDir = resolve(arg('patches', resolve(here, '../patches')))
const say = (line) => console.log(`ui-check: ${line}`)

const ui = join(tree, 'packages/trueforge-ui')
const sdk = join(tree, 'packages/trueforge-sdk')
// The runtime package inside a checkout of its repository, or the package folder itself.
const runtimeSource = [join(runtimeArg, 'packages/truefoundry-agents-assistant-ui-runtime'), runtimeArg].find((d) =>
  existsSync(join(d, 'src/server/index.ts')),
)
if (!existsSync(join(ui, 'package.json'))) throw new Error(`${tree} has no packages/trueforge-ui`)
if (runtimeSource === undefined) {
  throw new Error(`${runtimeArg} holds no assistant-ui runtime source (src/server/index.ts)`)
}
const runtimeVersion = JSON.parse(readFileSync(join(runtimeSource, 'package.json'), 'utf8')).version
const uiPkg = JSON.parse(readFileSync(join(ui, 'package.json'), 'utf8'))
const lockedRuntime = uiPkg.dependencies['@truefoundry/assistant-ui-runtime']
if (runtimeVersion !== lockedRuntime) {
  throw new Error(`the runtime source is ${runtimeVersion}; the UI package locks ${lockedRuntime}`)
}

// --- the UI files the series changes (from the patches, so no git state is needed)
const changed = new Set()
for (const f of readdirSync(patchesDir)
  .filter((f) => f.endsWith('.patch'))
  .sort()) {
  for (const m of readFileSync(join(patchesDir, f), 'utf8').matchAll(/^\+\+\+ b\/(packages\/trueforge-ui\/\S+)$/gm)) {
    changed.add(m[1])
  }
}
const changedTs = [...changed].filter((f) => /\.tsx?$/.test(f) && existsSync(join(tree, f))).sort()
const changedTests = changedTs.filter((f) => /\.test\.tsx?$/.test(f))
if (changedTs.length === 0) throw new Error('the series changes no TypeScript file of packages/trueforge-ui')

// --- tools: the UI's test tools and the dependencies the registry serves, at the UI's ranges
// (@assistant-ui/core, @truefoundry/* and @openuidev/react-ui at its range are not served).
const UNSERVED = ['@assistant-ui/core', '@openuidev/react-ui', 'truefoundry-gateway-sdk']
const want = [
  'typescript',
  '@types/node',
  '@types/react',
  '@types/react-dom',
  'react',
  'vitest',
  'jsdom',
  '@testing-library/react',
  '@testing-library/dom',
  '@testing-library/jest-dom',
  'vite-plugin-svgr',
  '@types/react-syntax-highlighter',
  'eslint',
  '@eslint/js',
  'typescript-eslint',
  'eslint-plugin-react-hooks',
  'globals',
]
  .map((n) => `${n}@${uiPkg.devDependencies[n]}`)
  .concat(`react-dom@${uiPkg.devDependencies.react}`)
  .concat(
    Object.entries(uiPkg.dependencies)
      .filter(([n, v]) => !n.startsWith('@truefoundry/') && !UNSERVED.includes(n) && !v.startsWith('workspace:'))
      .map(([n, v]) => `${n}@${v.includes('||') ? v.split('||').pop().trim() : v}`),
  )
  .sort()
const stamp = join(tools, '.installed')
if (!existsSync(stamp) || readFileSync(stamp, 'utf8') !== want.join(' ')) {
  say(`installing ${want.length} packages into ${tools} (once)`)
  rmSync(tools, { recursive: true, force: true })
  mkdirSync(tools, { recursive: true })
  writeFileSync(join(tools, 'package.json'), '{"private":true}\n')
  execFileSync('npm', ['install', '--no-audit', '--no-fund', '--silent', ...want], { cwd: tools, stdio: 'inherit' })
  writeFileSync(stamp, want.join(' '))
}
const nm = join(tools, 'node_modules')

const scratch = mkdtempSync(join(tmpdir(), 'tf-ui-check-'))
// A copy of the runtime's source, so that nothing is written into the given checkout.
const runtime = join(scratch, 'runtime')
cpSync(join(runtimeSource, 'src'), join(runtime, 'src'), { recursive: true })
cpSync(join(runtimeSource, 'package.json'), join(runtime, 'package.json'))
const links = [join(ui, 'node_modules'), join(runtime, 'node_modules'), join(scratch, 'node_modules')]
for (const l of links) {
  if (existsSync(l)) throw new Error(`${l} exists; this check links its own node_modules there`)
}
const report = { runtime: runtimeVersion, files: changedTs.length, typecheck: {}, tests: {} }
try {
  for (const l of links) symlinkSync(nm, l)

  // --- the SDK's declarations (the series changes its types)
  const sdkTypes = join(scratch, 'sdk')
  const tscBin = join(nm, 'typescript/bin/tsc')
  execFileSync(
    process.execPath,
    [
      tscBin,
      '-p',
      join(sdk, 'tsconfig.json'),
      '--declaration',
      '--emitDeclarationOnly',
      '--outDir',
      sdkTypes,
      '--typeRoots',
      join(nm, '@types'),
      '--types',
      'node',
      '--extendedDiagnostics',
      'false',
    ],
    { stdio: 'inherit' },
  )

  // --- 1. tsc
  const canary = join(scratch, 'canary.ts')
  writeFileSync(
    canary,
    [
      "import type { SandboxProviderBase } from '@/server/types.js';",
      "import type { DockerSandboxSettings } from '@/index.js';",
      "import type { TrueForgeApi } from '@truefoundry/trueforge-sdk';",
      '// Each line below is wrong; if a type were `any` its directive would be unused (TS2578).',
      '// @ts-expect-error: id is a string in the runtime',
      "export const row: SandboxProviderBase = { id: 1, name: 'x', catalogId: 'x', isConnected: true, execTimeoutMs: 1, autoStopIntervalInMinutes: 1, autoArchiveIntervalInMinutes: 1, autoDeleteIntervalInMinutes: 1 };",
      '// @ts-expect-error: a Docker setting needs its image',
      "export const docker: DockerSandboxSettings = { type: 'docker' };",
      '// @ts-expect-error: the SDK manifest is a union discriminated by type',
      "export const manifest: TrueForgeApi.SandboxProviderManifest = { type: 'docker', image: 2 };",
      '',
    ].join('\n'),
  )
  const tsconfig = join(scratch, 'tsconfig.json')
  writeFileSync(
    tsconfig,
    JSON.stringify(
      {
        extends: join(ui, 'tsconfig.json'),
        compilerOptions: {
          noEmit: true,
          rootDir: '/',
          types: ['node', 'vitest/globals'],
          paths: {
            '@/*': [join(ui, 'src/*')],
            '@truefoundry/assistant-ui-runtime': [join(runtime, 'src/index.ts')],
            '@truefoundry/assistant-ui-runtime/server': [join(runtime, 'src/server/index.ts')],
            '@truefoundry/assistant-ui-runtime/plugins/truefoundry-agent-server-adapter': [
              join(runtime, 'src/plugins/truefoundry-agent-server-adapter/index.ts'),
            ],
            '@truefoundry/trueforge-sdk': [join(sdkTypes, 'index.d.ts')],
          },
        },
        include: [],
        // The UI's svg module declarations and its test setup (jest-dom's matchers) come along.
        files: [
          ...changedTs.map((f) => join(tree, f)),
          canary,
          join(ui, 'src/svg.d.ts'),
          join(ui, 'test/testSetup.ts'),
        ],
      },
      null,
      2,
    ),
  )
  const t0 = Date.now()
  const tsc = spawnSync(process.execPath, [tscBin, '-p', tsconfig, '--pretty', 'false'], {
    cwd: scratch,
    encoding: 'utf8',
  })
  // `file(line,col): error TSn: message`, or `error TSn: message` for the program as a whole.
  const errors = [...tsc.stdout.matchAll(/^(?:(.+?)\(\d+,\d+\): )?error (TS\d+): (.*)$/gm)].map(
    ([line, file, code, msg]) => ({
      line,
      file: file === undefined ? canary : resolve(scratch, file),
      code,
      msg,
    }),
  )
  if (tsc.status !== 0 && errors.length === 0)
    throw new Error(`tsc failed without a diagnostic: ${tsc.stdout}${tsc.stderr}`)
  const seriesFiles = new Set([...changedTs.map((f) => join(tree, f)), canary])
  const missingModule = (e) => /^Cannot find (?:module|type definition file for) '([^']+)'/.exec(e.msg)?.[1]
  const unserved = (m) => m !== undefined && UNSERVED.some((u) => m === u || m.startsWith(`${u}/`))
  const inSeries = errors.filter((e) => seriesFiles.has(e.file))
  const blocking = inSeries.filter((e) => !(e.code === 'TS2307' && unserved(missingModule(e))))
  const elsewhere = errors.filter((e) => !seriesFiles.has(e.file))
  // Errors elsewhere: each unserved module a file cannot find, and what follows from it (implicit
  // `any`s and the like in the files importing it); anything else is listed whole.
  const byModule = {}
  const other = []
  for (const e of elsewhere) {
    const m = missingModule(e)
    const key =
      m === undefined
        ? 'follow-on'
        : unserved(m)
          ? m
              .split('/')
              .slice(0, m.startsWith('@') ? 2 : 1)
              .join('/')
          : undefined
    if (key === undefined) other.push(e)
    else byModule[key] = (byModule[key] ?? 0) + 1
  }
  if (other.length > 0) byModule.other = other.length
  report.typecheck = {
    ms: Date.now() - t0,
    files: seriesFiles.size,
    errors_in_series_files: blocking.length,
    unserved_modules_in_series_files: inSeries.length - blocking.length,
    errors_elsewhere: elsewhere.length,
    elsewhere_by_cause: byModule,
    elsewhere_other: other.map((e) => e.line),
  }
  say(
    `tsc (TypeScript ${JSON.parse(readFileSync(join(nm, 'typescript/package.json'), 'utf8')).version}, the UI's tsconfig): ` +
      `${seriesFiles.size - 1} series files and the canary, ${blocking.length} error(s) in them` +
      `${inSeries.length - blocking.length ? ` (+${inSeries.length - blocking.length} unserved module(s))` : ''}; ` +
      `${elsewhere.length} in other files of the package (${
        Object.entries(byModule)
          .map(([k, v]) => `${k}: ${v}`)
          .join(', ') || 'none'
      })`,
  )
  if (other.length > 0)
    say(`errors elsewhere not caused by an unserved module:\n${other.map((e) => e.line).join('\n')}`)
  if (blocking.length > 0) {
    console.error(blocking.map((e) => e.line).join('\n'))
    throw new Error(`tsc: ${blocking.length} error(s) in the series' UI files`)
  }

  // --- 2. vitest
  const config = join(scratch, 'vitest.config.mjs')
  writeFileSync(
    config,
    [
      `import svgr from ${JSON.stringify(join(nm, 'vite-plugin-svgr/dist/index.js'))};`,
      'export default {',
      `  root: ${JSON.stringify(ui)},`,
      "  plugins: [svgr({ include: '**/*.svg', svgrOptions: { icon: true } })],",
      '  resolve: {',
      '    alias: [',
      `      { find: /^@\\//, replacement: ${JSON.stringify(join(ui, 'src') + '/')} },`,
      `      { find: /^@truefoundry\\/assistant-ui-runtime\\/server$/, replacement: ${JSON.stringify(join(runtime, 'src/server/index.ts'))} },`,
      // The runtime's root module builds assistant-ui runtime extras when it loads (unserved
      // @assistant-ui/core); the settings page needs only its /server types, so the root is stubbed.
      `      { find: /^@truefoundry\\/assistant-ui-runtime$/, replacement: ${JSON.stringify(join(here, 'stubs/unserved.mjs'))} },`,
      `      { find: /^@truefoundry\\/trueforge-sdk$/, replacement: ${JSON.stringify(join(sdk, 'src/index.ts'))} },`,
      ...UNSERVED.map(
        (m) =>
          `      { find: new RegExp(${JSON.stringify(`^${m.replace(/[/.]/g, '\\$&')}(/.*)?$`)}), replacement: ${JSON.stringify(join(here, 'stubs/unserved.mjs'))} },`,
      ),
      '    ],',
      '  },',
      '  test: {',
      "    environment: 'jsdom',",
      '    globals: true,',
      `    include: ${JSON.stringify(changedTests.map((f) => relative(ui, join(tree, f))))},`,
      `    setupFiles: [${JSON.stringify(join(ui, 'test/testSetup.ts'))}],`,
      '  },',
      '};',
      '',
    ].join('\n'),
  )
  const t1 = Date.now()
  const vitest = spawnSync(process.execPath, [join(nm, 'vitest/vitest.mjs'), 'run', '--config', config], {
    cwd: tree,
    encoding: 'utf8',
    env: { ...process.env, NO_COLOR: '1' },
  })
  const out = vitest.stdout + vitest.stderr
  const files = /^ +Test Files +(.*)$/m.exec(out)?.[1]
  const tests = /^ +Tests +(.*)$/m.exec(out)?.[1]
  report.tests = { ms: Date.now() - t1, files: changedTests, test_files: files, tests }
  say(`vitest (jsdom): ${changedTests.length} test files; files: ${files}; tests: ${tests}`)
  if (vitest.status !== 0) {
    console.error(out.split('\n').slice(-80).join('\n'))
    throw new Error('vitest failed')
  }

  // --- 3. eslint, with the UI's own config (eslint.config.js), over the series' UI files
  const t2 = Date.now()
  const eslint = spawnSync(
    process.execPath,
    [
      join(nm, 'eslint/bin/eslint.js'),
      '--max-warnings',
      '0',
      '--format',
      'json',
      ...changedTs.map((f) => join(tree, f)),
    ],
    { cwd: ui, encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 },
  )
  let results
  try {
    results = JSON.parse(eslint.stdout)
  } catch {
    throw new Error(`eslint failed: ${eslint.stdout}${eslint.stderr}`)
  }
  const lintErrors = results.reduce((n, r) => n + r.errorCount, 0)
  const lintWarnings = results.reduce((n, r) => n + r.warningCount, 0)
  report.lint = { ms: Date.now() - t2, files: results.length, errors: lintErrors, warnings: lintWarnings }
  say(`eslint (the UI's config): ${results.length} files, ${lintErrors} errors, ${lintWarnings} warnings`)
  if (lintErrors + lintWarnings > 0) {
    for (const r of results) {
      for (const m of r.messages)
        console.error(`${relative(tree, r.filePath)}:${m.line}:${m.column} ${m.ruleId} ${m.message}`)
    }
    throw new Error('eslint reported problems in the series UI files')
  }
  report.ok = true
} finally {
  for (const l of links) rmSync(l, { force: true })
  if (reportFile) writeFileSync(reportFile, JSON.stringify(report, null, 2))
  if (report.ok && !process.env.UI_CHECK_KEEP) rmSync(scratch, { recursive: true, force: true })
  else say(`scratch kept: ${scratch}`)
}
