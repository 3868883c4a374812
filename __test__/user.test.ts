// Images that run as a non-root USER (common for pinned team images): the sandbox must still be
// created, its root and layout dirs owned by that user, and uploads writable by it. The images
// are built here from the local busybox image (no registry needed) and removed afterwards.

import { DockerSandboxProvider } from '..'
import { BUSYBOX, docker, dockerTry, ok, run, SandboxTracker, uniqueNamespace } from './helpers'

const namespace = uniqueNamespace('t-user')
const tracker = new SandboxTracker(namespace)
const numericImage = `trueforge-sandbox-test-user:${namespace}-numeric`
const namedImage = `trueforge-sandbox-test-user:${namespace}-named`
const providers: Array<InstanceType<typeof DockerSandboxProvider>> = []

beforeAll(() => {
  // A numeric uid:gid that no passwd file names, and a named user the image's passwd defines.
  docker(['build', '-q', '-t', numericImage, '-'], `FROM ${BUSYBOX}\nUSER 1000:1000\n`)
  docker(
    ['build', '-q', '-t', namedImage, '-'],
    `FROM ${BUSYBOX}\n` +
      `RUN echo 'app:x:1001:1002::/home/app:/bin/sh' >> /etc/passwd && echo 'app:x:1002:' >> /etc/group\n` +
      'USER app\n',
  )
}, 60_000)

afterAll(async () => {
  for (const p of providers) await tracker.cleanup(p)
  dockerTry(['rmi', '-f', numericImage, namedImage])
})

test.each([
  ['numeric USER 1000:1000', () => numericImage, '1000', '1000'],
  ['named USER app (1001:1002)', () => namedImage, '1001', '1002'],
])('an image with %s gets a working sandbox', async (_label, image, uid, gid) => {
  const p = new DockerSandboxProvider({ image: image(), namespace })
  providers.push(p)
  const id = await tracker.create(p)
  expect(await ok(p, id, 'id -u; id -g; pwd')).toBe(`${uid}\n${gid}\n${id}\n`)
  // The sandbox root and the layout dirs belong to the user.
  await ok(p, id, 'mkdir -p skills && echo x > f.txt')
  for (const d of [p.getFileUploadsDir(id), p.getSkillsDir(id), p.getToolResultDumpDir(id)]) {
    expect((await run(p, id, `test -w ${d} && touch ${d}/probe`)).exitCode).toBe(0)
  }
  // Uploaded files are the user's: it can change them, and replace them after chmod 0555.
  await p.uploadFile({ sandboxId: id, remotePath: 'up/x.txt', content: Buffer.from('up') })
  expect(await ok(p, id, 'stat -c %u:%g up/x.txt && echo more >> up/x.txt && cat up/x.txt')).toBe(
    `${uid}:${gid}\nupmore\n`,
  )
  await ok(p, id, 'chmod 0555 up/x.txt')
  await p.uploadFile({ sandboxId: id, remotePath: 'up/x.txt', content: Buffer.from('again') })
  expect(await ok(p, id, 'cat up/x.txt')).toBe('again')
  // Parent dirs an upload creates are the user's too: it can write next to the file.
  await p.uploadFile({ sandboxId: id, remotePath: 'deep/er/in.csv', content: Buffer.from('a,b\n') })
  expect(await ok(p, id, 'stat -c %u:%g deep deep/er && echo x > deep/er/out.txt && cat deep/er/out.txt')).toBe(
    `${uid}:${gid}\n${uid}:${gid}\nx\n`,
  )
})
