'use strict';
// Self time of a `node --cpu-prof` profile by function, and by where the
// function lives (node internals, express, idem-node's JavaScript, the
// addon as "(program)"/native frames): `node profile-summary.js FILE [TOP]`.

const fs = require('node:fs');

const [file, top = 25] = process.argv.slice(2);
const profile = JSON.parse(fs.readFileSync(file, 'utf8'));
const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const self = new Map();
const deltas = profile.timeDeltas;
profile.samples.forEach((id, i) => self.set(id, (self.get(id) || 0) + (deltas[i] || 0)));
const total = [...self.values()].reduce((a, b) => a + b, 0);

const where = (url) => {
  if (!url) return '(native or VM)';
  if (url.startsWith('node:')) return 'node internals';
  const m = url.match(/node_modules\/((?:@[^/]+\/)?[^/]+)/);
  if (m) return m[1];
  if (url.includes('idem-node/')) return 'idem-node (JS)';
  return url.replace(/^file:\/\//, '');
};
const fns = new Map();
const places = new Map();
for (const [id, t] of self) {
  const { callFrame: f } = byId.get(id);
  const name = `${f.functionName || '(anonymous)'} ${f.url ? `${f.url.split('/').slice(-2).join('/')}:${f.lineNumber + 1}` : ''}`;
  fns.set(name, (fns.get(name) || 0) + t);
  const place = where(f.url);
  places.set(place, (places.get(place) || 0) + t);
}
const show = (map, n) =>
  [...map]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .forEach(([k, t]) => console.log(`${((100 * t) / total).toFixed(1).padStart(5)}%  ${k}`));
console.log(`total ${(total / 1e6).toFixed(2)} s sampled\n-- by place`);
show(places, 15);
console.log('-- by function');
show(fns, Number(top));
