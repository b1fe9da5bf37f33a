// MultiSelect over gRPC with @grpc/grpc-js, loading the repository's proto at run time.

import { randomUUID } from 'node:crypto';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

import { codeSignal, historyRows, localChoice, scores, signal } from './device.js';

export const PROTO = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..', 'proto', 'recsvc', 'v1', 'selection.proto');

let service = null;

function serviceClass() {
  if (service === null) {
    const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, defaults: true, oneofs: true });
    service = grpc.loadPackageDefinition(definition).recsvc.v1.PrivateSelection;
  }
  return service;
}

// A PrivateSelection client (plaintext unless `credentials` are given).
export function connect(target, credentials = grpc.credentials.createInsecure()) {
  const Client = serviceClass();
  return new Client(target, credentials);
}

// The signals sent through each client, by user id and request id: a repeated request resends
// the SAME signal. A fresh draw under a request id the server has seen would give it a second,
// independent look at the history (it refuses the mismatch, but only after seeing it). A request
// id reused with another history, epsilon, k, signal kind or bundle is refused before anything is drawn.
const SENT = new WeakMap();
const MEMORY = 4096; // requests remembered per client, oldest forgotten first

function rememberedSignal(client, bundle, kind, userId, requestId, history, epsilon, k, randomWords) {
  if (kind !== 'code' && kind !== 'lattice') throw new RangeError(`signal must be 'code' or 'lattice'; got ${JSON.stringify(kind)}`);
  if (!SENT.has(client)) SENT.set(client, new Map());
  const sent = SENT.get(client);
  const key = JSON.stringify([userId, requestId]);
  const inputs = JSON.stringify([bundle.version, bundle.codebookVersion, kind, Array.from(historyRows(bundle, history)), epsilon, k]);
  const before = sent.get(key);
  if (before !== undefined) {
    if (before.inputs !== inputs) {
      throw new Error(`request_id ${JSON.stringify(requestId)} was already sent by this device with another history, epsilon, k, signal kind or bundle; a new request needs a new request_id`);
    }
    return before.fields;
  }
  const fields = kind === 'code'
    ? { code: codeSignal(bundle, history, epsilon, randomWords), codebook_version: bundle.codebookVersion }
    : { lattice_signal: signal(bundle, history, epsilon, randomWords).map(String), grid_step: bundle.gridStep }; // int64 as strings
  sent.set(key, { inputs, fields });
  if (sent.size > MEMORY) sent.delete(sent.keys().next().value);
  return fields;
}

function call(client, method, request, metadata, deadlineMs) {
  return new Promise((resolve, reject) => {
    client[method](request, metadata, { deadline: Date.now() + deadlineMs }, (err, answer) => (err ? reject(err) : resolve(answer)));
  });
}

// Multi-selection: sends the signal of `history` (`signal`: 'code', the default, or 'lattice'),
// receives k items and keeps the best locally.
// Repeating a call with the same requestId (a retry) resends the same signal and replays the answer.
// Resolves to { itemId, itemIds, epsilonSpent, budgetRemaining, charged, replayed, requestId };
// the server never learns itemId. A refusal rejects with a grpc error (err.code, err.details).
export async function multiselect(client, bundle, { userId = '', history, epsilon, k, requestId = randomUUID(), token = null, deadlineMs = 30000, randomWords, signal: kind = 'code' }) {
  const metadata = new grpc.Metadata();
  if (token) metadata.add('authorization', `Bearer ${token}`);
  const hist = Array.from(history, String);
  const request = {
    user_id: userId,
    request_id: requestId,
    ...rememberedSignal(client, bundle, kind, userId, requestId, hist, epsilon, k, randomWords),
    embedding_version: bundle.version,
    k,
    epsilon,
  };
  const answer = await call(client, 'MultiSelect', request, metadata, deadlineMs);
  const itemIds = answer.item_ids;
  return {
    itemId: itemIds[localChoice(scores(bundle, hist, itemIds))],
    itemIds,
    epsilonSpent: answer.epsilon_spent,
    budgetRemaining: answer.budget_remaining,
    charged: answer.charged,
    replayed: answer.replayed,
    requestId: answer.request_id || requestId,
  };
}
