#!/usr/bin/env node
// Prints what this device computes, as JSON, for the Python cross-check
// (tests/service/test_multiselect_js.py): `node bin/crosscheck.js BUNDLE_DIR < query.json` with
// query {histories: [[item ids]], items: [item ids], draws: N}; prints {embeddings, scores, noise}:
// each history's clipped embedding and true scores of `items`, and N Laplace(0, 1) draws.

import { readFileSync } from 'node:fs';

import { embedding, laplaceNoise, loadBundle, scores } from '../src/device.js';

const bundle = loadBundle(process.argv[2]);
const query = JSON.parse(readFileSync(0, 'utf8'));
const out = {
  embeddings: query.histories.map((h) => Array.from(embedding(bundle, h))),
  scores: query.histories.map((h) => scores(bundle, h, query.items).map((s) => (s === -Infinity ? null : s))),
  noise: Array.from(laplaceNoise(query.draws)),
};
process.stdout.write(JSON.stringify(out));
