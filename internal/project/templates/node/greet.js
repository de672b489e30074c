// greet returns a greeting for name.
function greet(name) {
  return `Hello, ${name}!`;
}

module.exports = { greet };
