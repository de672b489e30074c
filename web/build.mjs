// Builds the web UI into internal/web/dist, which the Go binary embeds.
// The output is deterministic (no hashes, no timestamps, no source maps),
// so a rebuild of unchanged sources gives the same bytes: internal/web's
// test rebuilds into a temporary folder and compares (see docs/RATIONALE.md).
//
//   node build.mjs              build into ../internal/web/dist
//   node build.mjs --out DIR    build into DIR
import { build } from 'esbuild';
import { cpSync, mkdirSync, readdirSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const i = process.argv.indexOf('--out');
const out = resolve(i > 0 ? process.argv[i + 1] : join(here, '..', 'internal', 'web', 'dist'));

rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

await build({
  entryPoints: { app: join(here, 'src', 'main.ts'), frame: join(here, 'src', 'frame.ts') },
  outdir: out,
  bundle: true,
  format: 'iife',
  target: 'es2022',
  minify: true,
  legalComments: 'none',
  charset: 'utf8',
  logLevel: 'warning',
});
await build({
  entryPoints: { app: join(here, 'src', 'app.css') },
  outdir: out,
  bundle: true,
  minify: true,
  legalComments: 'none',
  charset: 'utf8',
  logLevel: 'warning',
});
for (const f of readdirSync(join(here, 'static'))) {
  cpSync(join(here, 'static', f), join(out, f));
}
