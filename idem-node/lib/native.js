'use strict';
// Loads the addon: `idempotence.node` next to the package's files, or in
// the platform's package (`idempotence-linux-x64-gnu`, published by the
// release workflow), or the library the workspace's build left under target/ in a
// checkout (IDEM_NODE_ADDON names another file). `process.dlopen` loads a
// shared library of any name, so the build's `libidem_node.so` is used as
// it is.
const fs = require('node:fs');
const path = require('node:path');

function candidates() {
  const root = path.join(__dirname, '..');
  const found = [];
  if (process.env.IDEM_NODE_ADDON) return [process.env.IDEM_NODE_ADDON];
  found.push(path.join(root, 'idempotence.node'));
  const abi = { linux: '-gnu', win32: '-msvc' }[process.platform] || '';
  try {
    found.push(require.resolve(`idempotence-${process.platform}-${process.arch}${abi}/idempotence.node`));
  } catch {
    // Not installed: a checkout, or a platform without a prebuilt addon.
  }
  const target = process.env.CARGO_TARGET_DIR || path.join(root, '..', 'target');
  const library = { linux: 'libidem_node.so', darwin: 'libidem_node.dylib', win32: 'idem_node.dll' }[process.platform];
  if (library) {
    // `cargo build` leaves it in debug/, `cargo test` in debug/deps/: the
    // newer one is the latest build's.
    const built = ['debug', path.join('debug', 'deps'), 'release']
      .map((dir) => path.join(target, dir, library))
      .filter((file) => fs.existsSync(file))
      .sort((a, b) => fs.statSync(b).mtimeMs - fs.statSync(a).mtimeMs);
    found.push(...built);
  }
  return found;
}

function load() {
  const tried = candidates();
  for (const file of tried) {
    if (!fs.existsSync(file)) continue;
    const module = { exports: {} };
    process.dlopen(module, file);
    return module.exports;
  }
  throw new Error(
    `the idempotence addon was not found (looked for ${tried.join(', ')}); ` +
      'in a checkout, build it with `cargo build -p idem-node`',
  );
}

module.exports = load();
