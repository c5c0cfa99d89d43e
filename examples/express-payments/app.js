'use strict';
// An Express payments service on Redis with idem's middleware in place of
// the hand-written `SET key NX` recipe such services carry. Every decision
// (statuses, fingerprints, keys, replays) is made in Rust by idem-http.

const express = require('express');
const { openStore, idempotency } = require('idempotence');

const store = openStore(process.env.IDEM_REDIS_URL || 'redis://127.0.0.1:6379');
const charges = [];

const app = express();
// Before the body parser: the middleware reads the body and puts it back.
app.use(
  idempotency({
    store,
    namespace: 'payments',
    requireKey: true,
    // A retry built later carries another client_ts: it is the same request.
    routes: [{ pattern: '/payments', policy: { exclude: ['/client_ts'] } }],
    // Keys belong to the authenticated principal.
    scope: (req) => `merchant:${req.get('x-merchant') || 'anonymous'}`,
  }),
);
app.use(express.json());

app.post('/payments', (req, res) => {
  const { amount, currency } = req.body;
  if (!Number.isInteger(amount) || amount <= 0) {
    return res.status(400).json({ error: 'amount must be a positive integer of cents' });
  }
  const charge = { id: `ch_${charges.length + 1}`, amount, currency };
  charges.push(charge);
  return res.status(201).json(charge);
});

app.get('/payments', (req, res) => res.json(charges));

if (require.main === module) {
  const port = Number(process.env.PORT || 8000);
  // PORT=0 takes a free port; the line says which.
  const server = app.listen(port, () => console.log(`payments on http://127.0.0.1:${server.address().port}`));
}

module.exports = { app, charges };
