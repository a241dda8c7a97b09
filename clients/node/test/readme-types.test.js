'use strict';

// Every JavaScript and TypeScript example of README.md type-checks against
// the package's own types (index.d.ts, found through package.json's
// `types`, as an app finds them) under `tsc --strict`: a README edit or a
// type change that breaks an example fails here.
//
// Each ```js, ```javascript, ```ts and ```typescript block is a module of
// its own: JavaScript as `tsc --strict --checkJs` checks it (a
// `require('ratelimitd-client')` is typed by index.d.ts), TypeScript as
// TypeScript, with Express's types (@types/express) and Node's, and
// top-level await allowed. Other blocks (sh, diff, plain output) are not
// code.
//
// Fragments: a block that uses names its README section defines elsewhere
// (an Express `app`, a shared `client`, your own handlers) lists them in an
// HTML comment on the line right before its opening fence:
//
//     <!-- example assumes: app, client -->
//
// and gets each with the type CONTEXT gives it. A name CONTEXT does not
// know fails the test; add it there.

const { test } = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const ts = require('typescript');

const PACKAGE = path.join(__dirname, '..');
const README = path.join(PACKAGE, 'README.md');
// The module the fragments' names come from; it exists only in the program.
const CONTEXT_MODULE = 'readme-example-context';

/** What a fragment may assume, and its type. */
const CONTEXT = {
  app: "import('express').Express",
  client: "import('ratelimitd-client').RateLimitClient",
  rateLimiter: "typeof import('ratelimitd-client').rateLimiter",
  key: 'string',
  exportHandler: "import('express').RequestHandler",
  loginHandler: "import('express').RequestHandler",
  degradedCounter: '{ inc(labels: { reason: string }): void }',
  plans: '{ of(user: string): Promise<string> }',
};

const LANGUAGES = { js: 'js', javascript: 'js', ts: 'ts', typescript: 'ts' };
const ASSUMES = /^<!--\s*example assumes:\s*(.*?)\s*-->\s*$/;

/** The README's code blocks in JavaScript or TypeScript, with the line of each fence and what each assumes. */
function examples(text) {
  const lines = text.split('\n');
  const found = [];
  for (let i = 0; i < lines.length; i += 1) {
    const open = /^```(\w*)\s*$/.exec(lines[i]);
    if (!open) continue;
    let end = i + 1;
    while (end < lines.length && !lines[end].startsWith('```')) end += 1;
    const language = LANGUAGES[open[1]];
    if (language) {
      const assumes = ASSUMES.exec(lines[i - 1] ?? '');
      found.push({
        fence: i + 1,
        language,
        assumes: assumes ? assumes[1].split(',').map((name) => name.trim()).filter(Boolean) : [],
        code: lines.slice(i + 1, end).join('\n'),
      });
    }
    i = end;
  }
  return found;
}

/**
 * The diagnostics of `tsc --strict` on the examples, each as
 * `README.md:line:column: TSnnnn: message`. An example's file is one line
 * (its assumed names, or empty) then the block, so the file's line n
 * (from 0) is the README's line fence + n.
 */
function typeCheck(blocks) {
  const files = new Map();
  const contextFile = path.join(PACKAGE, `${CONTEXT_MODULE}.d.ts`);
  files.set(
    contextFile,
    Object.entries(CONTEXT)
      .map(([name, type]) => `export declare const ${name}: ${type};`)
      .join('\n'),
  );
  const where = new Map();
  for (const block of blocks) {
    const file = path.join(PACKAGE, `README.md.line-${block.fence}.${block.language}`);
    const names = block.assumes.join(', ');
    let prelude = '';
    if (names && block.language === 'js') prelude = `const { ${names} } = require('./${CONTEXT_MODULE}');`;
    if (names && block.language === 'ts') prelude = `import { ${names} } from './${CONTEXT_MODULE}';`;
    files.set(file, `${prelude}\n${block.code}\n`);
    where.set(file, block);
  }

  const options = {
    strict: true,
    noEmit: true,
    allowJs: true,
    checkJs: true,
    target: ts.ScriptTarget.ES2022,
    module: ts.ModuleKind.Preserve,
    moduleResolution: ts.ModuleResolutionKind.Bundler,
    moduleDetection: ts.ModuleDetectionKind.Force,
    esModuleInterop: true,
    types: ['node', 'express'],
    // The package by its name, as an installed dependency: its package.json's `types`.
    paths: { 'ratelimitd-client': [PACKAGE] },
  };
  const host = ts.createCompilerHost(options);
  const { fileExists, readFile, getSourceFile } = host;
  host.fileExists = (name) => files.has(name) || fileExists.call(host, name);
  host.readFile = (name) => files.get(name) ?? readFile.call(host, name);
  host.getSourceFile = (name, version, ...rest) =>
    files.has(name)
      ? ts.createSourceFile(name, files.get(name), version, true)
      : getSourceFile.call(host, name, version, ...rest);
  const program = ts.createProgram([...where.keys()], options, host);

  return ts.getPreEmitDiagnostics(program).map((diagnostic) => {
    const message = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n  ');
    if (!diagnostic.file) return `TS${diagnostic.code}: ${message}`;
    const { line, character } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start ?? 0);
    const block = where.get(diagnostic.file.fileName);
    const at = block
      ? `README.md:${block.fence + line}:${character + 1}`
      : `${path.relative(PACKAGE, diagnostic.file.fileName)}:${line + 1}:${character + 1}`;
    return `${at}: TS${diagnostic.code}: ${message}`;
  });
}

test("the README's JavaScript and TypeScript examples type-check against index.d.ts under --strict", () => {
  const blocks = examples(fs.readFileSync(README, 'utf8'));
  assert.ok(blocks.length >= 8, `found ${blocks.length} examples in README.md: did the fences change?`);
  for (const block of blocks) {
    const unknown = block.assumes.filter((name) => !(name in CONTEXT));
    assert.deepEqual(unknown, [], `README.md:${block.fence - 1}: \`example assumes\` names unknown to CONTEXT`);
  }
  const errors = typeCheck(blocks);
  if (errors.length) assert.fail(`tsc --strict on the README's examples:\n${errors.join('\n')}`);
});

test('the check finds a type error in an example, at its README line', () => {
  const text = [
    'Some text.',
    '',
    '<!-- example assumes: client -->',
    '```js',
    "client.check('k', { type: 'fixed_window', limit: 5 });",
    '```',
    '```ts',
    "import { RateLimitClient } from 'ratelimitd-client';",
    'const n: number = new RateLimitClient().address;',
    '```',
    '<!-- example assumes: client -->',
    '```typescript',
    "for (const { decision, error } of await client.checkMany([{ key: 'k', policy: 'p' }])) {",
    "  if (error?.code !== undefined) { const index: number = error.index; console.log(index); }",
    '  else if (!error) console.log(decision.allowed);',
    '}',
    '```',
  ].join('\n');
  const blocks = examples(text);
  assert.deepEqual(
    blocks.map(({ fence, language, assumes }) => ({ fence, language, assumes })),
    [
      { fence: 4, language: 'js', assumes: ['client'] },
      { fence: 7, language: 'ts', assumes: [] },
      { fence: 12, language: 'ts', assumes: ['client'] },
    ],
  );
  const errors = typeCheck(blocks);
  assert.equal(errors.length, 2, errors.join('\n'));
  assert.match(errors[0], /^README\.md:5:\d+: TS2769: No overload matches this call/);
  assert.match(errors[1], /^README\.md:9:7: TS2322: Type 'string' is not assignable to type 'number'/);
});
