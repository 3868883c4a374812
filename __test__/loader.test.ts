// The loader (lib/loader.js) on a machine no binary fits: its error names this platform and the
// supported ones (package.json's napi.targets) and keeps the generated loader's errors as cause.
// Each case runs in a child Node.js with process.platform/arch replaced before the require.

import { spawnSync } from 'node:child_process'
import { join } from 'node:path'

const root = join(__dirname, '..')
const SUPPORTED = ['linux-x64-gnu', 'linux-arm64-gnu', 'darwin-x64', 'darwin-arm64']

function loadAs(platform: string, arch: string): any {
  const script = `
    Object.defineProperty(process, 'platform', { value: ${JSON.stringify(platform)} })
    Object.defineProperty(process, 'arch', { value: ${JSON.stringify(arch)} })
    try {
      require(${JSON.stringify(root)})
      console.log(JSON.stringify({ loaded: true }))
    } catch (e) {
      console.log(JSON.stringify({ message: e.message, code: e.code, platform: e.platform,
        supported: e.supportedPlatforms, cause: e.cause instanceof Error }))
    }`
  const r = spawnSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 30_000 })
  expect(r.status).toBe(0)
  return JSON.parse(r.stdout.trim().split('\n').pop() as string)
}

test('this machine loads its binary', () => {
  expect(loadAs(process.platform, process.arch)).toEqual({ loaded: true })
})

test('an unsupported CPU: the platform and the supported list are named', () => {
  const r = loadAs('linux', 'riscv64')
  expect(r.code).toBe('ERR_NATIVE_ADDON_UNAVAILABLE')
  expect(r.platform).toBe('linux-riscv64-gnu')
  expect(r.supported).toEqual(SUPPORTED)
  expect(r.message).toContain('cannot load the native addon on linux-riscv64-gnu')
  expect(r.message).toContain('there is no prebuilt binary for it')
  expect(r.message).toContain(`Supported platforms: ${SUPPORTED.join(', ')}.`)
  expect(r.cause).toBe(true)
})

test('an unsupported OS: Windows is named as such', () => {
  const r = loadAs('win32', 'x64')
  expect(r.platform).toBe('win32-x64')
  expect(r.message).toContain('there is no prebuilt binary for it')
})

// darwin-arm64 is supported, but no darwin-arm64 binary loads on a Linux machine.
const onLinux = process.platform === 'linux' ? test : test.skip

onLinux('a supported platform whose package is missing: says to reinstall it on that machine', () => {
  const r = loadAs('darwin', 'arm64')
  expect(r.platform).toBe('darwin-arm64')
  expect(r.message).toContain('its package trueforge-docker-sandbox-darwin-arm64 is missing or failed to load')
  expect(r.message).toContain(`Supported platforms: ${SUPPORTED.join(', ')}.`)
})
