// A test without dependencies: `node test.js` (or `npm test`), or
// run_js_file with path "__NAME__/test.js". It throws when greet is wrong.
const { greet } = require('./greet');

const got = greet('you');
if (got !== 'Hello, you!') {
  throw new Error(`greet('you') returned ${JSON.stringify(got)}`);
}
console.log('ok: greet');
