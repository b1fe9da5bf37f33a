#!/usr/bin/env node
// Prints what this device computes, as JSON, for the Python cross-check
// (tests/service/test_multiselect_js.py): `node bin/crosscheck.js BUNDLE_DIR < query.json` with
// query {histories: [[item ids]], items: [item ids], epsilon, words: [32-bit words]}; prints
// {embeddings, scores, signals, codes, codeSignals}: each history's clipped embedding, true scores
// of `items`, lattice signal (decimal strings) drawn from `words` (the same words for each
// history), code, and code signal drawn from `words`.

import { readFileSync } from 'node:fs';

import { code, embedding, fixedWords, latticeSignal, loadBundle, randomizedResponse, scores } from '../src/device.js';

const bundle = loadBundle(process.argv[2]);
const query = JSON.parse(readFileSync(0, 'utf8'));
const out = {
  embeddings: query.histories.map((h) => Array.from(embedding(bundle, h))),
  scores: query.histories.map((h) => scores(bundle, h, query.items).map((s) => (s === -Infinity ? null : s))),
  signals: query.histories.map((h) => latticeSignal(embedding(bundle, h), query.epsilon, bundle.gridStep, bundle.latticeRadius, fixedWords(query.words)).map(String)),
  codes: query.histories.map((h) => code(bundle, h)),
  codeSignals: query.histories.map((h) => randomizedResponse(code(bundle, h), bundle.codebook.length, query.epsilon, fixedWords(query.words))),
};
process.stdout.write(JSON.stringify(out));
