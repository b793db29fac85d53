// Drives dsec through the unmodified E2B JS SDK (TestCompat/E2B runs it
// once per pinned SDK version). Configuration is E2B's own environment:
// E2B_API_KEY, E2B_API_URL, E2B_SANDBOX_URL; E2B_SDK_DIR is where the SDK
// is installed, E2B_TEMPLATE the template to create.
'use strict'
const path = require('path')
const { Sandbox, CommandExitError } = require(path.join(process.env.E2B_SDK_DIR, 'node_modules', 'e2b'))

const template = process.env.E2B_TEMPLATE || 'base'
const run = 'r' + Date.now().toString(36)
const watchdog = setTimeout(() => { console.error('FAIL: the program took over 150 s'); process.exit(2) }, 150_000)

function check(cond, what, got) {
  if (!cond) throw new Error('check failed: ' + what + (got === undefined ? '' : ' (got ' + JSON.stringify(got) + ')'))
}
async function rejects(p, what) {
  try { await p } catch (e) { return e }
  throw new Error('check failed: ' + what + ' did not throw')
}
async function until(what, fn) {
  const end = Date.now() + 20_000
  for (;;) {
    if (await fn()) return
    if (Date.now() > end) throw new Error('check failed: timed out waiting for ' + what)
    await new Promise((r) => setTimeout(r, 100))
  }
}
const steps = []
async function step(name, fn) {
  const t0 = Date.now()
  await fn()
  steps.push(name + ' ' + (Date.now() - t0) + 'ms')
}

async function main() {
  let sb
  await step('create', async () => {
    sb = await Sandbox.create(template, { metadata: { job: 'rl', run }, envs: { SB_VAR: 'sbval' }, timeoutMs: 120_000 })
    check(/^[a-z0-9]+$/.test(sb.sandboxId), 'sandbox id is [a-z0-9]+', sb.sandboxId)
    check(await sb.isRunning(), 'isRunning')
  })
  await step('run', async () => {
    const r = await sb.commands.run('echo hi; echo err >&2')
    check(r.exitCode === 0, 'exit code 0', r.exitCode)
    check(r.stdout === 'hi\n', 'stdout', r.stdout)
    check(r.stderr === 'err\n', 'stderr', r.stderr)
  })
  await step('exit code', async () => {
    const e = await rejects(sb.commands.run('echo out; exit 3'), 'exit 3')
    check(e instanceof CommandExitError, 'CommandExitError', String(e))
    check(e.exitCode === 3, 'exitCode 3', e.exitCode)
    check(e.stdout === 'out\n', 'stdout of failed command', e.stdout)
  })
  await step('timeout', async () => {
    const e = await rejects(sb.commands.run('sleep 30', { timeoutMs: 1000 }), 'a command over its timeoutMs')
    check(e.name === 'TimeoutError', 'TimeoutError', String(e))
  })
  await step('env and cwd', async () => {
    const r = await sb.commands.run('echo $FOO $SB_VAR; pwd', { envs: { FOO: 'bar' }, cwd: '/tmp' })
    check(r.stdout === 'bar sbval\n/tmp\n', 'env and cwd', r.stdout)
  })
  await step('streaming', async () => {
    const outs = [], errs = []
    const r = await sb.commands.run('for i in 1 2 3; do echo o$i; echo e$i >&2; sleep 0.2; done',
      { onStdout: (d) => outs.push(d), onStderr: (d) => errs.push(d) })
    check(outs.join('') === 'o1\no2\no3\n', 'onStdout', outs)
    check(errs.join('') === 'e1\ne2\ne3\n', 'onStderr', errs)
    check(outs.length >= 2, 'stdout arrived in pieces', outs.length)
    check(r.stdout === 'o1\no2\no3\n', 'stdout', r.stdout)
  })
  await step('background, list, connect, kill', async () => {
    const h = await sb.commands.run('echo started; sleep 600', { background: true })
    check(h.pid > 0, 'pid', h.pid)
    const procs = await sb.commands.list()
    check(procs.some((p) => p.pid === h.pid && p.cmd === '/bin/bash'), 'list shows it', procs)
    const c = await sb.commands.connect(h.pid)
    await until('connected output', () => c.stdout.includes('started'))
    check(await sb.commands.kill(h.pid) === true, 'kill')
    const e = await rejects(h.wait(), 'wait on a killed command')
    check(e instanceof CommandExitError, 'killed → CommandExitError', String(e))
    await until('killed process leaves the list', async () => !(await sb.commands.list()).some((p) => p.pid === h.pid))
    check(await sb.commands.kill(h.pid) === false, 'second kill')
  })
  await step('stdin', async () => {
    const h = await sb.commands.run('cat', { background: true, stdin: true })
    await sb.commands.sendStdin(h.pid, 'hello\n')
    await until('cat echoes its stdin', () => h.stdout.includes('hello'))
    await sb.commands.closeStdin(h.pid)
    const r = await h.wait()
    check(r.exitCode === 0, 'cat exits 0 once its stdin is closed', r.exitCode)
    check(r.stdout === 'hello\n', 'stdout of cat', r.stdout)
  })
  await step('pty', async () => {
    const dec = new TextDecoder()
    let out = ''
    const h = await sb.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }) } })
    await sb.pty.sendInput(h.pid, new TextEncoder().encode('echo pty$((40+2))\n'))
    await until('the shell on the pty runs the input', () => out.includes('pty42'))
    await sb.pty.resize(h.pid, { cols: 100, rows: 30 })
    await sb.pty.sendInput(h.pid, new TextEncoder().encode('stty size | tr " " x\n'))
    await until('the terminal is resized', () => out.includes('30x100'))
    await sb.pty.sendInput(h.pid, new TextEncoder().encode('exit\n'))
    const r = await h.wait()
    check(r.exitCode === 0, 'the shell exits 0', r.exitCode)
  })
  await step('files', async () => {
    await sb.files.write('/tmp/d/a.txt', 'hello')
    check(await sb.files.read('/tmp/d/a.txt') === 'hello', 'read text')
    const bin = new Uint8Array([0, 1, 2, 255, 254, 10, 13])
    await sb.files.write('/tmp/d/b.bin', bin.buffer)
    const got = await sb.files.read('/tmp/d/b.bin', { format: 'bytes' })
    check(Buffer.from(got).equals(Buffer.from(bin)), 'binary round trip', Array.from(got))
    const infos = await sb.files.write([{ path: '/tmp/m/1.txt', data: 'one' }, { path: '/tmp/m/2.txt', data: 'two' }])
    check(infos.length === 2 && infos[1].path === '/tmp/m/2.txt', 'multi-file write', infos)
    check(await sb.files.read('/tmp/m/2.txt') === 'two', 'multi-file content')
    const ents = await sb.files.list('/tmp/d')
    check(ents.map((e) => e.name).join(',') === 'a.txt,b.bin', 'list', ents.map((e) => e.name))
    check(ents[0].type === 'file' && ents[0].size === 5 && ents[0].path === '/tmp/d/a.txt', 'entry', ents[0])
    const deep = await sb.files.list('/tmp', { depth: 2 })
    check(deep.some((e) => e.path === '/tmp/m/1.txt'), 'list depth 2', deep.map((e) => e.path))
    check(await sb.files.exists('/tmp/d/a.txt') === true, 'exists')
    check(await sb.files.exists('/tmp/nope') === false, 'not exists')
    const info = await sb.files.getInfo('/tmp/d')
    check(info.type === 'dir', 'getInfo dir', info)
    check(await sb.files.makeDir('/tmp/new/sub') === true, 'makeDir')
    check(await sb.files.makeDir('/tmp/new/sub') === false, 'makeDir again')
    await sb.files.rename('/tmp/d/a.txt', '/tmp/d/c.txt')
    check(await sb.files.read('/tmp/d/c.txt') === 'hello', 'renamed')
    await sb.files.remove('/tmp/d/c.txt')
    check(await sb.files.exists('/tmp/d/c.txt') === false, 'removed')
    await sb.files.remove('/tmp/m')
    check(await sb.files.exists('/tmp/m') === false, 'removed dir')
    const e = await rejects(sb.files.read('/tmp/nope'), 'read a missing file')
    check(/not.?found|does not exist/i.test(String(e)), 'missing file error', String(e))
  })
  await step('watch', async () => {
    await sb.files.makeDir('/tmp/w')
    const events = []
    const w = await sb.files.watchDir('/tmp/w', (ev) => events.push(ev))
    await sb.files.write('/tmp/w/x', 'x')
    await until('create event', () => events.some((e) => e.name === 'x' && e.type === 'create'))
    await w.stop()
  })
  await step('parallel', async () => {
    const rs = await Promise.all(Array.from({ length: 8 }, (_, i) => sb.commands.run('sleep 0.3; echo ' + i)))
    check(rs.every((r, i) => r.stdout === i + '\n'), 'parallel outputs', rs.map((r) => r.stdout))
  })
  await step('setTimeout and getInfo', async () => {
    await sb.setTimeout(60_000)
    const info = await sb.getInfo()
    const left = new Date(info.endAt).getTime() - Date.now()
    check(left > 30_000 && left <= 61_000, 'endAt after setTimeout', info.endAt)
    check(info.metadata.run === run, 'metadata', info.metadata)
  })
  await step('list', async () => {
    const items = await Sandbox.list({ query: { metadata: { run } } }).nextItems()
    check(items.length === 1 && items[0].sandboxId === sb.sandboxId, 'list by metadata', items)
    const none = await Sandbox.list({ query: { metadata: { run: 'other' } } }).nextItems()
    check(none.length === 0, 'list filters', none)
  })
  await step('connect', async () => {
    const sb2 = await Sandbox.connect(sb.sandboxId)
    const r = await sb2.commands.run('wc -c < /tmp/d/b.bin')
    check(r.stdout.trim() === '7', 'connected sandbox sees the files', r.stdout)
  })
  await step('kill', async () => {
    check(await sb.kill() === true, 'kill')
    check(await sb.isRunning() === false, 'not running after kill')
    check(await Sandbox.kill(sb.sandboxId) === false, 'second kill')
    await rejects(Sandbox.connect(sb.sandboxId), 'connect to a killed sandbox')
  })
  console.log('OK ' + steps.join('; '))
}

main().then(() => { clearTimeout(watchdog); process.exit(0) }, (e) => {
  console.error('FAIL: ' + (e && e.stack || e))
  process.exit(1)
})
