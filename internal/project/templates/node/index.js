// __NAME__: a small CommonJS program. It runs the same way under node
// (`node index.js`, `npm start`) and in Quro's embedded JavaScript engine
// (run_js_file with path "__NAME__/index.js").
const { greet } = require('./greet');

console.log(greet('__NAME__'));
