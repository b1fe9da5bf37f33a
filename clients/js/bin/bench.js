#!/usr/bin/env node
// Times the device steps for scripts/bench/device.py --js:
// `node bin/bench.js BUNDLE_DIR ROUNDS CALLS HISTORY K`; prints {medians: {row: [median seconds
// per round]}, p99: {row: seconds over every call}}.

import { codeSignal, latticeSignal, loadBundle, localChoice, scores, signal, wordStream } from '../src/device.js';

const [dir, rounds, calls, historySize, k] = [process.argv[2], ...process.argv.slice(3, 7).map(Number)];
const bundle = loadBundle(dir);
const n = bundle.itemIds.length;
const pick = (size) => Array.from({ length: size }, () => bundle.itemIds[Math.floor(Math.random() * n)]);
const histories = Array.from({ length: calls }, () => pick(historySize));
const answers = Array.from({ length: calls }, () => pick(k));
const steps = {
  noise: () => latticeSignal(new Float64Array(bundle.dim), 1, bundle.gridStep, bundle.latticeRadius, wordStream()),
  code: (i) => codeSignal(bundle, histories[i], 1),
  signal: (i) => signal(bundle, histories[i], 1),
  rerank: (i) => localChoice(scores(bundle, histories[i], answers[i])),
  device: (i) => [codeSignal(bundle, histories[i], 1), localChoice(scores(bundle, histories[i], answers[i]))],
  'device-lattice': (i) => [signal(bundle, histories[i], 1), localChoice(scores(bundle, histories[i], answers[i]))],
};
const median = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)]; };
for (const fn of Object.values(steps)) for (let i = 0; i < calls; i++) fn(i); // warm up the JIT
const out = Object.fromEntries(Object.keys(steps).map((name) => [name, []]));
const every = Object.fromEntries(Object.keys(steps).map((name) => [name, []]));
for (let r = 0; r < rounds; r++) {
  for (const [name, fn] of Object.entries(steps)) {
    const times = [];
    for (let i = 0; i < calls; i++) {
      const t = process.hrtime.bigint();
      fn(i);
      times.push(Number(process.hrtime.bigint() - t) / 1e9);
    }
    out[name].push(median(times));
    every[name].push(...times);
  }
}
const p99 = Object.fromEntries(Object.entries(every).map(([name, t]) => [name, [...t].sort((a, b) => a - b)[Math.floor(0.99 * (t.length - 1))]]));
process.stdout.write(JSON.stringify({ medians: out, p99 }));
