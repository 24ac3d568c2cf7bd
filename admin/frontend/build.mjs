// Builds the flow builder bundle: src/main.jsx -> ../static/flows/builder.js and builder.css.
//
// Deterministic: the same sources and lock file give byte-identical output (esbuild writes no
// timestamps or absolute paths; no source map). The first line of each output is a comment with a
// SHA-256 of the sources (src/**, package.json, package-lock.json, this file), computed the same way
// as tests/admin/test_builder_bundle.py does, so a stale bundle fails the Python suite without Node.
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, sep } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as esbuild from 'esbuild';

const here = dirname(fileURLToPath(import.meta.url));
const outdir = join(here, '..', 'static', 'flows');

/** Every file under `dir`, as paths relative to this folder with "/" separators. */
function walk(dir) {
  const found = [];
  for (const name of readdirSync(dir)) {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) {
      found.push(...walk(path));
    } else {
      found.push(relative(here, path).split(sep).join('/'));
    }
  }
  return found;
}

/** sha256 over "<path>\0<bytes>\0" of each input, in sorted path order (byte order of the path). */
export function sourcesHash() {
  const files = [...walk(join(here, 'src')), 'package.json', 'package-lock.json', 'build.mjs']
    .sort((a, b) => (Buffer.compare(Buffer.from(a), Buffer.from(b))));
  const hash = createHash('sha256');
  for (const file of files) {
    hash.update(Buffer.from(file, 'utf8'));
    hash.update(Buffer.from([0]));
    hash.update(readFileSync(join(here, file)));
    hash.update(Buffer.from([0]));
  }
  return hash.digest('hex');
}

const banner = `/*! lembra-flow-builder sources-sha256:${sourcesHash()} */`;

await esbuild.build({
  absWorkingDir: here,
  entryPoints: { builder: 'src/main.jsx' },
  outdir,
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
  jsx: 'automatic',
  loader: { '.js': 'jsx' },
  define: { 'process.env.NODE_ENV': '"production"' },
  legalComments: 'eof',
  sourcemap: false,
  charset: 'utf8',
  banner: { js: banner, css: banner },
  logLevel: 'info',
});
