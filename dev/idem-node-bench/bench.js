'use strict';
// idem's Express middleware beside Node's idempotency libraries, in one
// run: one server process per subject (server.js), all the same handler
// (one Redis INCR), loaded by wrk at 32 connections with the workspace's
// wrk scripts (dev/idem-bench/wrk): first.lua gives every request a fresh
// key, replay.lua cycles through 1000 keys, each recorded by one request
// before the rounds.
// Rounds interleave the subjects (the order rotates each round); a row is
// the median of the rounds. CPU per request is the server process's
// utime + stime (/proc/PID/stat, all its threads) over the requests wrk
// completed. Then a stampede: 200 keys x 20 concurrent duplicates per
// subject, counting the handler's executions with its INCR counter.
// Records expire with each library's retention (a day); the counters are
// deleted at the end.
//
// node bench.js [--rounds 7] [--seconds 4] [--connections 32]
//               [--subjects a,b] [--no-stampede] [--markdown BENCHMARKS.md]

const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');
const { createClient } = require('@redis/client');

const REDIS = process.env.IDEM_REDIS_URL || 'redis://127.0.0.1:6379';
const WRK = path.join(__dirname, '..', 'idem-bench', 'wrk');
const BODY = '{"amount":1250,"currency":"EUR","customer":"cus_4f9a2c81d0e7","description":"monthly plan 2024-117"}';
const ALL = ['plain', 'idem', 'idem-near', 'node-idempotency', 'express-idempotency', 'powertools', 'powertools-local'];
const LABEL = {
  plain: 'no idempotency',
  idem: 'idem (`idempotence`)',
  'idem-near': 'idem, near cache',
  'node-idempotency': '@node-idempotency/core',
  'express-idempotency': 'express-idempotency',
  powertools: 'Powertools makeIdempotent',
  'powertools-local': 'Powertools, local cache',
};
const PEERS = ['node-idempotency', 'express-idempotency', 'powertools', 'powertools-local'];
/** Keys replay.lua cycles through: its default. */
const KEYS = 1000;
const TICK = Number(execFileSync('getconf', ['CLK_TCK']).toString().trim());

function options() {
  const args = process.argv.slice(2);
  const take = (name, fallback) => {
    const at = args.indexOf(`--${name}`);
    return at === -1 ? fallback : args[at + 1];
  };
  return {
    rounds: Number(take('rounds', 7)),
    seconds: Number(take('seconds', 4)),
    connections: Number(take('connections', 32)),
    subjects: take('subjects', ALL.join(',')).split(','),
    stampede: !args.includes('--no-stampede'),
    markdown: take('markdown', null),
  };
}

/** CPU seconds the process has used, all threads: utime + stime. */
function cpuSeconds(pid) {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / TICK;
}

function start(subject, port, prefix) {
  const child = spawn(process.execPath, [path.join(__dirname, 'server.js'), subject, String(port), prefix], {
    // Express prints every 409 a library throws: kept out of the report.
    stdio: ['ignore', 'pipe', fs.openSync(path.join(os.tmpdir(), `idem-node-bench-${subject}.log`), 'w')],
    env: process.env,
  });
  return new Promise((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`${subject} exited with ${code}`)));
    child.stdout.once('data', () => resolve(child));
  });
}

/** wrk against `port` with `script`; requests, req/s, non-2xx and errors. */
function wrk(port, script, seconds, connections, env) {
  const out = execFileSync(
    'wrk',
    ['-t2', `-c${connections}`, `-d${seconds}s`, '-s', path.join(WRK, script), `http://127.0.0.1:${port}/pay`],
    { env: { ...process.env, ...env } },
  ).toString();
  const number = (re) => {
    const m = out.match(re);
    return m ? Number(m[1]) : 0;
  };
  const errors = out.match(/Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)/);
  return {
    requests: number(/(\d+) requests in/),
    rate: number(/Requests\/sec:\s+([\d.]+)/),
    bad: number(/Non-2xx or 3xx responses: (\d+)/) + (errors ? errors.slice(1).reduce((a, b) => a + Number(b), 0) : 0),
  };
}

/** One measured wrk run with the server's CPU time around it. */
function measure(server, script, seconds, connections, env) {
  const before = cpuSeconds(server.child.pid);
  const result = wrk(server.port, script, seconds, connections, env);
  const cpu = cpuSeconds(server.child.pid) - before;
  return { ...result, cpuUs: result.requests ? (cpu / result.requests) * 1e6 : NaN };
}

function post(agent, port, key) {
  return new Promise((resolve) => {
    const req = http.request(
      {
        agent,
        port,
        host: '127.0.0.1',
        method: 'POST',
        path: '/pay',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
      },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode));
      },
    );
    req.on('error', () => resolve(0));
    req.end(BODY);
  });
}

/** The keys replay.lua cycles through (`PREFIX-replay-1` … `-1000`), each run once. */
async function record(server, connections) {
  const agent = new http.Agent({ keepAlive: true, maxSockets: connections });
  const statuses = await Promise.all(
    Array.from({ length: KEYS }, (_, k) => post(agent, server.port, `${server.prefix}-replay-${k + 1}`)),
  );
  agent.destroy();
  const bad = statuses.filter((status) => status !== 200).length;
  if (bad) throw new Error(`${server.subject}: ${bad} of ${KEYS} replay keys were not recorded`);
}

/** 200 keys x 20 concurrent duplicates, 10 keys at a time: executions. */
async function stampede(redis, server, run) {
  const counter = `${server.prefix}:runs`;
  const before = Number((await redis.get(counter)) || 0);
  const agent = new http.Agent({ keepAlive: true, maxSockets: 400 });
  const statuses = {};
  for (let batch = 0; batch < 20; batch += 1) {
    const calls = [];
    for (let k = 0; k < 10; k += 1) {
      const key = `stampede-${run}-${batch * 10 + k}`;
      for (let d = 0; d < 20; d += 1) calls.push(post(agent, server.port, key));
    }
    for (const status of await Promise.all(calls)) statuses[status] = (statuses[status] || 0) + 1;
  }
  agent.destroy();
  const runs = Number((await redis.get(counter)) || 0) - before;
  return { runs, statuses };
}

const median = (values) => {
  const sorted = values.filter((v) => !Number.isNaN(v)).sort((a, b) => a - b);
  if (!sorted.length) return NaN;
  const mid = sorted.length >> 1;
  return sorted.length % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;
};
const fmt = (n) => Math.round(n).toLocaleString('en-US');

/**
 * The table: medians of the rounds, and the ratios as medians of each
 * round's ratio (subjects measured minutes apart share less of the
 * machine's load than those of one round). idem with its near cache is
 * only in the last row (its replays against the best peer's) unless
 * `nearRow`.
 */
function table(subjects, samples, stampedes, nearRow) {
  const rounds = samples[subjects[0]].first.length;
  const peers = PEERS.filter((p) => samples[p]);
  const rate = (s, w) => median(samples[s][w].map((x) => x.rate));
  const cpu = (s, w) => median(samples[s][w].map((x) => x.cpuUs));
  const ratio = (s, w, against) => {
    const per = [];
    for (let r = 0; r < rounds; r += 1) per.push(samples[s][w][r].rate / Math.max(...against.map((a) => samples[a][w][r].rate)));
    const m = median(per);
    return Number.isFinite(m) ? m.toFixed(2) : '—';
  };
  const lines = [
    '| server | first req/s | CPU µs/req | replay req/s | CPU µs/req | first ÷ none | stampede: runs for 200 keys |',
    '|---|---:|---:|---:|---:|---:|---:|',
  ];
  for (const s of subjects) {
    if (s === 'idem-near' && !nearRow) continue;
    const runs = stampedes[s] ? fmt(stampedes[s].runs) : '—';
    const none = samples.plain ? ratio(s, 'first', ['plain']) : '—';
    lines.push(
      `| ${LABEL[s]} | ${fmt(rate(s, 'first'))} | ${cpu(s, 'first').toFixed(0)} | ${fmt(rate(s, 'replay'))} | ` +
        `${cpu(s, 'replay').toFixed(0)} | ${none} | ${runs} |`,
    );
  }
  if (samples.idem && peers.length) {
    const near = samples['idem-near']
      ? `; near cache **${ratio('idem-near', 'replay', peers)}** (${fmt(rate('idem-near', 'replay'))} req/s, ` +
        `${cpu('idem-near', 'replay').toFixed(0)} µs)`
      : '';
    lines.push(
      `| idem ÷ best peer (targets 1.25, 1.2; 2 with near cache) | **${ratio('idem', 'first', peers)}** | | ` +
        `**${ratio('idem', 'replay', peers)}**${near} | | | |`,
    );
  }
  return lines.join('\n');
}

function writeMarkdown(file, text) {
  const begin = '<!-- BEGIN idem-node-bench -->';
  const end = '<!-- END idem-node-bench -->';
  const doc = fs.readFileSync(file, 'utf8');
  const from = doc.indexOf(begin);
  const to = doc.indexOf(end);
  if (from === -1 || to === -1) throw new Error(`${file} has no ${begin} … ${end} markers`);
  fs.writeFileSync(file, `${doc.slice(0, from + begin.length)}\n${text}\n${doc.slice(to)}`);
}

async function main() {
  const opts = options();
  const run = Date.now().toString(36);
  const servers = {};
  let port = 20000 + Math.floor(Math.random() * 20000);
  for (const subject of opts.subjects) {
    const prefix = `nb-${run}-${subject}`;
    servers[subject] = { subject, port, prefix, child: await start(subject, port, prefix) };
    port += 1;
  }
  const stop = () => Object.values(servers).forEach((s) => s.child.kill());
  process.on('exit', stop);
  for (const signal of ['SIGINT', 'SIGTERM']) process.on(signal, () => process.exit(1));
  const redis = await createClient({ url: REDIS }).connect();
  console.log(`load average at start: ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);

  // Warm-up, not counted: first executions, then the replay keys recorded
  // one request each, so no replay run meets a key in flight.
  for (const s of Object.values(servers)) {
    wrk(s.port, 'first.lua', 1, opts.connections, { IDEM_WRK_PREFIX: `${s.prefix}-warm` });
    await record(s, opts.connections);
    wrk(s.port, 'replay.lua', 1, opts.connections, { IDEM_WRK_PREFIX: `${s.prefix}-replay` });
  }

  const samples = {};
  for (const s of opts.subjects) samples[s] = { first: [], replay: [] };
  for (let round = 0; round < opts.rounds; round += 1) {
    const order = opts.subjects.map((_, i) => opts.subjects[(i + round) % opts.subjects.length]);
    for (const subject of order) {
      const s = servers[subject];
      const first = measure(s, 'first.lua', opts.seconds, opts.connections, { IDEM_WRK_PREFIX: `${s.prefix}-r${round}` });
      const replay = measure(s, 'replay.lua', opts.seconds, opts.connections, { IDEM_WRK_PREFIX: `${s.prefix}-replay` });
      samples[subject].first.push(first);
      samples[subject].replay.push(replay);
      console.log(
        `round ${round} ${subject}: first ${fmt(first.rate)} req/s ${first.cpuUs.toFixed(0)} µs (bad ${first.bad}), ` +
          `replay ${fmt(replay.rate)} req/s ${replay.cpuUs.toFixed(0)} µs (bad ${replay.bad})`,
      );
    }
  }
  const stampedes = {};
  if (opts.stampede) {
    for (const subject of opts.subjects) {
      stampedes[subject] = await stampede(redis, servers[subject], run);
      console.log(`stampede ${subject}: ${stampedes[subject].runs} runs, statuses ${JSON.stringify(stampedes[subject].statuses)}`);
    }
  }
  for (const s of opts.subjects) {
    const bad = [...samples[s].first, ...samples[s].replay].reduce((a, x) => a + x.bad, 0);
    if (bad) console.log(`${s}: ${bad} non-2xx answers or socket errors in the measured runs`);
  }
  console.log(`load average at end: ${os.loadavg().map((l) => l.toFixed(2)).join(' ')}`);
  console.log(table(opts.subjects, samples, stampedes, true));
  const text = table(opts.subjects, samples, stampedes, false);
  if (opts.markdown) writeMarkdown(opts.markdown, text);
  await redis.del(Object.values(servers).map((s) => `${s.prefix}:runs`));
  await redis.close();
  stop();
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
