// A live `recsvc serve` for the tests: a throwaway toy artifact with a client bundle (built by
// recsvc.service.testing.make_artifact), a fresh ledger, a free port; stopped by stop().

import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

// RECSVC_PYTHON, else the repository's .venv, else python3.
export function python() {
  if (process.env.RECSVC_PYTHON) return process.env.RECSVC_PYTHON;
  const venv = join(REPO, '.venv', 'bin', 'python');
  return existsSync(venv) ? venv : 'python3';
}

function env() {
  return { ...process.env, PYTHONPATH: [REPO, process.env.PYTHONPATH].filter(Boolean).join(':'), PYTHONUNBUFFERED: '1' };
}

// Builds the toy artifact in a new temporary directory; returns { dir, artifact, bundle }.
export function toyArtifact() {
  const dir = mkdtempSync(join(tmpdir(), 'recsvc-js-'));
  const artifact = join(dir, 'toy');
  const made = spawnSync(python(), ['-c', 'import sys; from recsvc.service.testing import make_artifact; make_artifact(__import__("pathlib").Path(sys.argv[1]), bundle=True)', artifact],
    { cwd: REPO, env: env(), encoding: 'utf8' });
  if (made.status !== 0) throw new Error(`make_artifact failed: ${made.stderr}`);
  return { dir, artifact, bundle: join(artifact, 'client') };
}

// Starts `recsvc serve` on the artifact with a fresh ledger; resolves to { target, stop }.
export function serve(dir, artifact, ...extra) {
  const args = ['-m', 'recsvc.app.cli', 'serve', '--artifacts', artifact, '--ledger', join(dir, 'ledger.db'), '--port', '0', '--drain-delay', '0', '--grace', '0.5', ...extra];
  const proc = spawn(python(), args, { cwd: REPO, env: env(), stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (chunk) => { log += chunk; });
  const stop = () => new Promise((done) => {
    if (proc.exitCode !== null) return done();
    proc.once('exit', () => done());
    proc.kill('SIGKILL');
  });
  return new Promise((ok, fail) => {
    const timer = setTimeout(() => { stop(); fail(new Error(`recsvc serve did not start in 60 s:\n${log}`)); }, 60000);
    proc.once('exit', (code) => { clearTimeout(timer); fail(new Error(`recsvc serve exited (${code}):\n${log}`)); });
    createInterface({ input: proc.stdout }).on('line', (line) => {
      const m = /listening on \S+:(\d+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        proc.removeAllListeners('exit');
        ok({ target: `127.0.0.1:${m[1]}`, stop });
      }
    });
  });
}

export function cleanup(dir) {
  rmSync(dir, { recursive: true, force: true });
}
