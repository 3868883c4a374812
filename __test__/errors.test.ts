// Error classes, injected host classes, option validation and the fixed parts of the class.

import {
  DockerSandboxProvider,
  SandboxEngineError,
  SandboxError,
  SandboxFileNotFoundError,
  SandboxFileTooLargeError,
  SandboxInvalidPathError,
  SandboxNotAvailableError,
  SandboxNotRegularFileError,
  SandboxPathIsDirectoryError,
  SandboxPathTraversalError,
  reapSandboxes,
} from '..'
import { BUSYBOX, ExecResult, ok, rejection, SandboxTracker, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-errors')
const tracker = new SandboxTracker(namespace)
const provider = new DockerSandboxProvider({ image: BUSYBOX, namespace, fileMaxBytes: 1024, uploadMaxBytes: 1024 })
let sandboxId: string

beforeAll(async () => {
  sandboxId = await tracker.create(provider)
  await ok(provider, sandboxId, 'mkdir -p adir && head -c 2000 /dev/zero > big.bin && mkfifo pipe')
})

afterAll(async () => {
  await tracker.cleanup(provider)
})

describe('the addon error classes', () => {
  test('SandboxNotAvailableError', () => {
    const e = new SandboxNotAvailableError('/workspace/X')
    expect(e).toBeInstanceOf(Error)
    expect(e).toBeInstanceOf(SandboxError)
    expect(e).toBeInstanceOf(SandboxNotAvailableError)
    expect(e.name).toBe('SandboxNotAvailableError')
    expect(e.statusCode).toBe(410)
    expect(e.message).toBe("Sandbox '/workspace/X' no longer exists — it may have been auto-deleted")
  })

  test('SandboxFileNotFoundError', () => {
    const e = new SandboxFileNotFoundError('/a/b.txt')
    expect(e).toBeInstanceOf(SandboxError)
    expect(e.name).toBe('SandboxFileNotFoundError')
    expect(e.statusCode).toBe(404)
    expect(e.message).toBe('File not found: /a/b.txt')
  })

  test('SandboxPathIsDirectoryError', () => {
    const e = new SandboxPathIsDirectoryError('/a')
    expect(e).toBeInstanceOf(SandboxError)
    expect(e.name).toBe('SandboxPathIsDirectoryError')
    expect(e.statusCode).toBe(400)
    expect(e.message).toBe('Path is a directory, not a file: /a')
  })

  test('SandboxFileTooLargeError', () => {
    const e = new SandboxFileTooLargeError('/a/big', 2000, 1024)
    expect(e).toBeInstanceOf(SandboxError)
    expect(e.name).toBe('SandboxFileTooLargeError')
    expect(e.statusCode).toBe(413)
    expect(e.message).toBe('File too large: /a/big (2000 bytes, max 1024)')
    expect(e.fileSize).toBe(2000)
    expect(e.maxSize).toBe(1024)
  })

  test('SandboxPathTraversalError', () => {
    const e = new SandboxPathTraversalError('../x')
    expect(e).toBeInstanceOf(SandboxError)
    expect(e.name).toBe('SandboxPathTraversalError')
    expect(e.statusCode).toBe(400)
    expect(e.message).toBe('Path must not contain ".." segments: ../x')
  })

  test('the extra classes: invalid path, not a regular file, engine', () => {
    // lib/errors.js takes (message, path) for these two; index.d.ts must declare that constructor
    // (`tsc` flags these two lines while it inherits Error's (message, options) instead).
    const ip = new SandboxInvalidPathError('bad path', '/p')
    expect(ip).toBeInstanceOf(SandboxError)
    expect(ip.name).toBe('SandboxInvalidPathError')
    expect(ip.statusCode).toBe(400)
    expect(ip.message).toBe('bad path')
    expect(ip.path).toBe('/p')
    const nr = new SandboxNotRegularFileError('not regular', '/dev/zero')
    expect(nr).toBeInstanceOf(SandboxError)
    expect(nr.name).toBe('SandboxNotRegularFileError')
    expect(nr.statusCode).toBe(400)
    expect(nr.message).toBe('not regular')
    expect(nr.path).toBe('/dev/zero')
    const en = new SandboxEngineError('engine down')
    expect(en).toBeInstanceOf(SandboxError)
    expect(en.name).toBe('SandboxEngineError')
    expect(en.statusCode).toBe(503)
    expect(en.message).toBe('engine down')
  })
})

describe('errors thrown by the provider', () => {
  test('unknown sandbox id: SandboxNotAvailableError with code', async () => {
    const id = '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV'
    const e = await rejection(provider.exec({ sandboxId: id, command: 'true' }))
    expect(e).toBeInstanceOf(SandboxNotAvailableError)
    expect(e.name).toBe('SandboxNotAvailableError')
    expect(e.statusCode).toBe(410)
    expect(e.code).toBe('SANDBOX_NOT_AVAILABLE')
    expect(e.message).toBe(`Sandbox '${id}' no longer exists — it may have been auto-deleted`)
  })

  test('missing file: SandboxFileNotFoundError with the path as given', async () => {
    const e = await rejection(provider.downloadFile({ sandboxId, path: 'nope/missing.txt' }))
    expect(e).toBeInstanceOf(SandboxFileNotFoundError)
    expect(e.statusCode).toBe(404)
    expect(e.code).toBe('FILE_NOT_FOUND')
    expect(e.message).toBe('File not found: nope/missing.txt')
  })

  test('directory: SandboxPathIsDirectoryError', async () => {
    const e = await rejection(provider.downloadFile({ sandboxId, path: 'adir' }))
    expect(e).toBeInstanceOf(SandboxPathIsDirectoryError)
    expect(e.statusCode).toBe(400)
    expect(e.code).toBe('PATH_IS_DIRECTORY')
    expect(e.message).toBe('Path is a directory, not a file: adir')
  })

  test('too large, both ways: SandboxFileTooLargeError with fileSize and maxSize', async () => {
    const up = await rejection(provider.uploadFile({ sandboxId, remotePath: 'up.bin', content: Buffer.alloc(2000, 1) }))
    expect(up).toBeInstanceOf(SandboxFileTooLargeError)
    expect(up.statusCode).toBe(413)
    expect(up.code).toBe('FILE_TOO_LARGE')
    expect(up.fileSize).toBe(2000)
    expect(up.maxSize).toBe(1024)
    expect(up.message).toBe('File too large: up.bin (2000 bytes, max 1024)')

    const down = await rejection(provider.downloadFile({ sandboxId, path: 'big.bin' }))
    expect(down).toBeInstanceOf(SandboxFileTooLargeError)
    expect(down.fileSize).toBe(2000)
    expect(down.maxSize).toBe(1024)
    expect(down.message).toBe('File too large: big.bin (2000 bytes, max 1024)')
  })

  test('"..": SandboxPathTraversalError', async () => {
    const e = await rejection(provider.uploadFile({ sandboxId, remotePath: '../x', content: Buffer.from('x') }))
    expect(e).toBeInstanceOf(SandboxPathTraversalError)
    expect(e.statusCode).toBe(400)
    expect(e.code).toBe('PATH_TRAVERSAL')
    expect(e.message).toBe('Path must not contain ".." segments: ../x')
  })

  test('special file: SandboxNotRegularFileError; empty path: SandboxInvalidPathError', async () => {
    const nr = await rejection(provider.downloadFile({ sandboxId, path: 'pipe' }))
    expect(nr).toBeInstanceOf(SandboxNotRegularFileError)
    expect(nr.code).toBe('NOT_REGULAR_FILE')
    expect(nr.statusCode).toBe(400)
    expect(nr.path).toBe('pipe')
    expect(nr.message).toContain('named pipe')
    const ip = await rejection(provider.downloadFile({ sandboxId, path: '' }))
    expect(ip).toBeInstanceOf(SandboxInvalidPathError)
    expect(ip.code).toBe('INVALID_PATH')
    expect(ip.statusCode).toBe(400)
  })

  test('unreachable engine: SandboxEngineError from createSandbox, success:false from exec', async () => {
    const p = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace,
      dockerHost: 'unix:///nonexistent/trueforge-test.sock',
    })
    const e = await rejection(p.createSandbox())
    expect(e).toBeInstanceOf(SandboxEngineError)
    expect(e.statusCode).toBe(503)
    expect(e.code).toBe('ENGINE_UNREACHABLE')
    expect(e.message).toContain('unix:///nonexistent/trueforge-test.sock')
    // exec never throws for infrastructure failures: the command never ran.
    const r = (await p.exec({ sandboxId: '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV', command: 'true' })) as ExecResult
    expect(r.success).toBe(false)
    if (!r.success) expect(r.error).toContain('unreachable')
  })
})

describe('one translation for every call path', () => {
  // lib/errors.js is internal; its translator is what every entry point goes through.
  const { fromNative } = require('../lib/errors.js') as { fromNative: (e: unknown, injected?: object) => any }
  const coded = (code: string, message: string, fields: object = {}) =>
    Object.assign(new Error(message), { code }, fields)

  test('reapSandboxes: a bad option is the TypeError naming it, an unreachable engine a SandboxEngineError', async () => {
    const bad = await rejection(reapSandboxes({ namespace: 'NOT OK' }))
    expect(bad).toBeInstanceOf(TypeError)
    expect(bad.code).toBe('INVALID_OPTION')
    expect(bad.option).toBe('namespace')
    expect(bad.message).toMatch(/^invalid option `namespace`: /)
    const down = await rejection(reapSandboxes({ dockerHost: 'unix:///nonexistent/trueforge-test.sock' }))
    expect(down).toBeInstanceOf(SandboxEngineError)
    expect(down.statusCode).toBe(503)
    expect(down.code).toBe('ENGINE_UNREACHABLE')
  })

  test('INTERNAL and codes without a class of their own are a SandboxError with status 500', () => {
    for (const code of ['INTERNAL', 'IMAGE_NOT_AVAILABLE', 'CREATE_FAILED', 'CODE_MODE_UNAVAILABLE', 'SOME_NEW_CODE']) {
      const e = fromNative(coded(code, 'it broke'))
      expect(e).toBeInstanceOf(SandboxError)
      expect(e).not.toBeInstanceOf(SandboxEngineError)
      expect(e.name).toBe('SandboxError')
      expect(e.statusCode).toBe(500)
      expect(e.code).toBe(code)
      expect(e.message).toBe('it broke')
    }
  })

  test("napi's and Node's own codes, and errors already translated, pass through unchanged", () => {
    for (const e of [
      coded('InvalidArg', 'x'),
      coded('ERR_INVALID_ARG_TYPE', 'x'),
      new SandboxFileNotFoundError('/a'),
      'text',
    ]) {
      expect(fromNative(e)).toBe(e)
    }
  })
})

describe('injected host error classes', () => {
  // The host's own classes: same names and constructor signatures, unrelated to the addon's.
  class HostError extends Error {
    constructor(
      message: string,
      public statusCode: number,
    ) {
      super(message)
      this.name = new.target.name
    }
  }
  class SandboxNotAvailableError extends HostError {
    constructor(public sandboxId: string) {
      super(`host: sandbox ${sandboxId} gone`, 410)
    }
  }
  class SandboxFileNotFoundError extends HostError {
    constructor(public path: string) {
      super(`host: not found ${path}`, 404)
    }
  }
  class SandboxPathIsDirectoryError extends HostError {
    constructor(public path: string) {
      super(`host: directory ${path}`, 400)
    }
  }
  class SandboxFileTooLargeError extends HostError {
    constructor(
      public path: string,
      public fileSize: number,
      public maxSize: number,
    ) {
      super(`host: too large ${path} ${fileSize}/${maxSize}`, 413)
    }
  }
  class SandboxPathTraversalError extends HostError {
    constructor(public path: string) {
      super(`host: traversal ${path}`, 400)
    }
  }

  const injected = new DockerSandboxProvider({
    image: BUSYBOX,
    namespace,
    fileMaxBytes: 1024,
    uploadMaxBytes: 1024,
    errors: {
      SandboxNotAvailableError,
      SandboxFileNotFoundError,
      SandboxPathIsDirectoryError,
      SandboxFileTooLargeError,
      SandboxPathTraversalError,
    },
  })

  test('SandboxNotAvailableError is the host class, from exec, upload and download', async () => {
    const id = '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV'
    for (const call of [
      () => injected.exec({ sandboxId: id, command: 'true' }),
      () => injected.uploadFile({ sandboxId: id, remotePath: 'f', content: Buffer.from('x') }),
      () => injected.downloadFile({ sandboxId: id, path: 'f' }),
    ]) {
      const e = await rejection(call())
      expect(e).toBeInstanceOf(SandboxNotAvailableError)
      expect(e).not.toBeInstanceOf(SandboxError)
      expect(e.name).toBe('SandboxNotAvailableError')
      expect(e.sandboxId).toBe(id)
      expect(e.statusCode).toBe(410)
      expect(e.message).toBe(`host: sandbox ${id} gone`)
    }
  })

  test('file errors are the host classes, built with the contract arguments', async () => {
    const nf = await rejection(injected.downloadFile({ sandboxId, path: 'missing.txt' }))
    expect(nf).toBeInstanceOf(SandboxFileNotFoundError)
    expect(nf).not.toBeInstanceOf(SandboxError)
    expect(nf.path).toBe('missing.txt')

    const dir = await rejection(injected.downloadFile({ sandboxId, path: 'adir' }))
    expect(dir).toBeInstanceOf(SandboxPathIsDirectoryError)
    expect(dir.path).toBe('adir')

    const big = await rejection(injected.downloadFile({ sandboxId, path: 'big.bin' }))
    expect(big).toBeInstanceOf(SandboxFileTooLargeError)
    expect([big.path, big.fileSize, big.maxSize]).toEqual(['big.bin', 2000, 1024])
    expect(big.message).toBe('host: too large big.bin 2000/1024')

    const up = await rejection(injected.uploadFile({ sandboxId, remotePath: 'u.bin', content: Buffer.alloc(1025) }))
    expect(up).toBeInstanceOf(SandboxFileTooLargeError)
    expect([up.fileSize, up.maxSize]).toEqual([1025, 1024])

    const tr = await rejection(injected.uploadFile({ sandboxId, remotePath: 'a/../../b', content: Buffer.from('x') }))
    expect(tr).toBeInstanceOf(SandboxPathTraversalError)
    expect(tr.path).toBe('a/../../b')
  })

  test('classes not injected fall back to the addon defaults', async () => {
    const partial = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace,
      errors: { SandboxFileNotFoundError },
    })
    const nf = await rejection(partial.downloadFile({ sandboxId, path: 'missing.txt' }))
    expect(nf).toBeInstanceOf(SandboxFileNotFoundError)
    const dir = await rejection(partial.downloadFile({ sandboxId, path: 'adir' }))
    expect(dir).toBeInstanceOf(SandboxError)
    expect(dir.name).toBe('SandboxPathIsDirectoryError')
  })
})

describe('a host module namespace with an abstract base, as TrueForge exports its errors', () => {
  // Shaped like the host's error module: an abstract base whose constructor takes the message,
  // subclasses with statusCode fields, and exports that are not classes at all.
  abstract class HostSandboxError extends Error {
    abstract readonly statusCode: 400 | 403 | 404 | 410 | 413
  }
  class HostFileNotFound extends HostSandboxError {
    readonly statusCode = 404
    constructor(path: string) {
      super(`File not found: ${path}`)
      this.name = 'SandboxFileNotFoundError'
    }
  }
  class HostNotAvailable extends HostSandboxError {
    readonly statusCode = 410
    constructor(id: string) {
      super(`Sandbox '${id}' no longer exists — it may have been auto-deleted`)
      this.name = 'SandboxNotAvailableError'
    }
  }
  const hostModule = Object.freeze(
    Object.assign(Object.create(null), {
      [Symbol.toStringTag]: 'Module',
      SandboxError: HostSandboxError,
      SandboxFileNotFoundError: HostFileNotFound,
      SandboxNotAvailableError: HostNotAvailable,
      validateNoPathTraversal: (_p: string) => undefined,
      PATH_LIMIT: 4096,
    }),
  )
  // What the host's download route does: its own errors answer with their status, the rest 424.
  const routeStatus = (e: unknown) => (e instanceof HostSandboxError ? e.statusCode : 424)
  const hosted = new DockerSandboxProvider({ image: BUSYBOX, namespace, errors: hostModule })

  test('the whole namespace is accepted; the classes it names are thrown', async () => {
    const nf = await rejection(hosted.downloadFile({ sandboxId, path: 'missing.txt' }))
    expect(nf).toBeInstanceOf(HostFileNotFound)
    expect(routeStatus(nf)).toBe(404)
    const gone = await rejection(hosted.exec({ sandboxId: '/workspace/01ARZ3NDEKTSV4RRFFQ69G5FAV', command: 'true' }))
    expect(gone).toBeInstanceOf(HostNotAvailable)
  })

  test("request errors it has no class for are built on the host's base, with their status codes", async () => {
    const cases: Array<[Promise<unknown>, string, string, number]> = [
      [
        hosted.uploadFile({ sandboxId, remotePath: 'a/../../b', content: Buffer.from('x') }),
        'SandboxPathTraversalError',
        'PATH_TRAVERSAL',
        400,
      ],
      [hosted.downloadFile({ sandboxId, path: 'bad\0path' }), 'SandboxInvalidPathError', 'INVALID_PATH', 400],
      [hosted.downloadFile({ sandboxId, path: 'pipe' }), 'SandboxNotRegularFileError', 'NOT_REGULAR_FILE', 400],
      [hosted.downloadFile({ sandboxId, path: 'adir' }), 'SandboxPathIsDirectoryError', 'PATH_IS_DIRECTORY', 400],
      [
        hosted.uploadFile({ sandboxId, remotePath: 'adir', content: Buffer.from('x') }),
        'SandboxPathIsDirectoryError',
        'PATH_IS_DIRECTORY',
        400,
      ],
    ]
    for (const [call, name, code, status] of cases) {
      const e = await rejection(call)
      expect(e).toBeInstanceOf(HostSandboxError)
      expect(e).toBeInstanceOf(Error)
      expect([e.name, e.code, e.statusCode, routeStatus(e)]).toEqual([name, code, status, status])
      // Still recognisable as ours.
      expect(e).toBeInstanceOf(SandboxError)
    }
    const tr = await rejection(hosted.uploadFile({ sandboxId, remotePath: 'a/../../b', content: Buffer.from('x') }))
    expect(tr).toBeInstanceOf(SandboxPathTraversalError)
    expect(tr.message).toBe('Path must not contain ".." segments: a/../../b')
    expect(tr.path).toBe('a/../../b')
    const big = await rejection(
      new DockerSandboxProvider({ image: BUSYBOX, namespace, errors: hostModule, fileMaxBytes: 1024 }).downloadFile({
        sandboxId,
        path: 'big.bin',
      }),
    )
    expect(big).toBeInstanceOf(HostSandboxError)
    expect(big).toBeInstanceOf(SandboxFileTooLargeError)
    expect([big.statusCode, big.fileSize, big.maxSize]).toEqual([413, 2000, 1024])
    expect(big.message).toBe('File too large: big.bin (2000 bytes, max 1024)')
  })

  test("engine failures stay outside the host's hierarchy", async () => {
    const down = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace,
      errors: hostModule,
      dockerHost: 'unix:///nonexistent/docker.sock',
      engineTimeoutMs: 2000,
    })
    const e = await rejection(down.createSandbox())
    expect(e).toBeInstanceOf(SandboxEngineError)
    expect(e).not.toBeInstanceOf(HostSandboxError)
    expect(routeStatus(e)).toBe(424)
  })

  test('our own classes are unaffected by a host base elsewhere', async () => {
    const e = await rejection(provider.uploadFile({ sandboxId, remotePath: 'a/../../b', content: Buffer.from('x') }))
    expect(e).toBeInstanceOf(SandboxPathTraversalError)
    expect(e).not.toBeInstanceOf(HostSandboxError)
    expect(Object.getPrototypeOf(e)).toBe(SandboxPathTraversalError.prototype)
  })
})

describe('option validation', () => {
  function optionError(options: unknown): any {
    try {
      new DockerSandboxProvider(options as any)
    } catch (e) {
      return e
    }
    throw new Error(`options ${JSON.stringify(options)} were accepted`)
  }

  test.each([
    ['image missing', 'image', {}],
    ['image not a string', 'image', { image: 3 }],
    ['image with a space', 'image', { image: 'a b' }],
    ['namespace with capitals', 'namespace', { image: BUSYBOX, namespace: 'Bad' }],
    ['namespace too long', 'namespace', { image: BUSYBOX, namespace: 'a'.repeat(33) }],
    ['execTimeoutMs 0', 'execTimeoutMs', { image: BUSYBOX, execTimeoutMs: 0 }],
    ['execTimeoutMs fractional', 'execTimeoutMs', { image: BUSYBOX, execTimeoutMs: 1.5 }],
    ['fileMaxBytes negative', 'fileMaxBytes', { image: BUSYBOX, fileMaxBytes: -1 }],
    ['maxOutputBytes below 1024', 'maxOutputBytes', { image: BUSYBOX, maxOutputBytes: 1000 }],
    ['gpus nonsense', 'gpus', { image: BUSYBOX, gpus: 'some' }],
    ['env with a bad name', 'env', { image: BUSYBOX, env: { 'A=B': '1' } }],
    ['reserved label', 'labels', { image: BUSYBOX, labels: { 'trueforge.sandbox.id': 'x' } }],
    ['dockerHost npipe (Windows only)', 'dockerHost', { image: BUSYBOX, dockerHost: 'npipe:////./pipe/docker_engine' }],
    [
      'dockerHost ssh with an option for a host',
      'dockerHost',
      { image: BUSYBOX, dockerHost: 'ssh://-oProxyCommand=x' },
    ],
    [
      'tls without a CA while verifying',
      'tls',
      { image: BUSYBOX, dockerHost: 'tcp://127.0.0.1:2376', tls: { cert: '/c.pem', key: '/k.pem' } },
    ],
    ['unknown option', 'imgae', { image: BUSYBOX, imgae: 'typo' }],
    ['unknown injected error', 'errors.NopeError', { image: BUSYBOX, errors: { NopeError: class {} } }],
    ['injected class not a constructor', 'errors.SandboxError', { image: BUSYBOX, errors: { SandboxError: 'x' } }],
    ['logger level not a function', 'logger.info', { image: BUSYBOX, logger: { info: 3 } }],
  ])('%s: throws a TypeError naming `%s`', (_label, option, options) => {
    const e = optionError(options)
    expect(e).toBeInstanceOf(TypeError)
    expect(e.code).toBe('INVALID_OPTION')
    expect(e.option).toBe(option)
    expect(e.message).toContain(`\`${option}\``)
  })

  test('a non-object throws naming `options`', () => {
    for (const v of [undefined, null, 'busybox', ['x']]) {
      const e = optionError(v)
      expect(e).toBeInstanceOf(TypeError)
      expect(e.code).toBe('INVALID_OPTION')
      expect(e.message).toContain('`options`')
    }
  })

  test('valid options are accepted and exposed', () => {
    const p = new DockerSandboxProvider({
      image: BUSYBOX,
      namespace: 'abc-123',
      execTimeoutMs: 1000,
      fileMaxBytes: 2048,
      maxOutputBytes: 1024,
      gpus: ['0'],
      env: { A_1: 'x' },
      labels: { team: 'a' },
      dockerHost: 'unix:///var/run/docker.sock',
      logger: { debug() {}, info() {}, warn() {}, error() {} },
    })
    expect(p.namespace).toBe('abc-123')
    expect(p.dockerHost).toBe('unix:///var/run/docker.sock')
  })
})

describe('fixed members', () => {
  test('type, supportsCodeMode, createCodeModeTransport, additional instructions', () => {
    expect(provider.type).toBe('docker')
    expect(provider.supportsCodeMode).toBe(true)
    expect(typeof provider.createCodeModeTransport().start).toBe('function')
    const text = provider.getAdditionalInstructions()
    expect(typeof text).toBe('string')
    expect(text).toContain(BUSYBOX)
    expect(text).toContain('/trueforge/uploads')
    expect(text).toContain('No GPU')
    // The default egress policy: the proxy and what it allows.
    expect(text).toContain('connections go through a proxy set in the environment')
    expect(text).toContain('every public host by name')
    const listed = new DockerSandboxProvider({
      image: BUSYBOX,
      egress: { allow: ['pkgs.example', '*.git.example'], deny: ['bad.git.example'] },
    })
    expect(listed.getAdditionalInstructions()).toContain(
      'allowed: pkgs.example, *.git.example; denied: bad.git.example',
    )
    const open = new DockerSandboxProvider({ image: BUSYBOX, egress: 'open' })
    expect(open.getAdditionalInstructions()).not.toMatch(/proxy|network/)
    const none = new DockerSandboxProvider({ image: BUSYBOX, egress: 'none' })
    expect(none.getAdditionalInstructions()).toContain('The sandbox has no network access.')
  })
})
