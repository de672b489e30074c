// Package calc is Tools.calc of the JS engine: an arithmetic expression
// evaluated without running any code. A package of its own (no import of
// the engine, its QuickJS or its sandbox) so that its fuzz target builds
// in seconds.
package calc

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Eval evaluates an arithmetic expression without running any code: numbers
// (1, 2.5, 1e3, 0x1f), + - * / % and ^ or ** (power, right-associative),
// parentheses, unary minus, the constants pi, e and tau, and the functions
// abs, sqrt, cbrt, exp, ln, log (base 10), log2, sin, cos, tan, asin, acos,
// atan, floor, ceil, round, trunc, sign, min, max, pow and hypot. It is
// Tools.calc; the error names the position of the first problem.
func Eval(expr string) (float64, error) {
	if len(expr) > maxCalcLen {
		return 0, fmt.Errorf("expression is longer than %d characters", maxCalcLen)
	}
	p := &calcParser{src: expr}
	p.next()
	v, err := p.expr(0)
	if err != nil {
		return 0, err
	}
	if p.tok.kind != tEOF {
		return 0, p.errorf("unexpected %s", p.tok)
	}
	return v, nil
}

const (
	maxCalcLen   = 10000
	maxCalcDepth = 200
)

type tokKind int

const (
	tEOF tokKind = iota
	tNum
	tIdent
	tOp // + - * / % ^ ** ( ) ,
)

type token struct {
	kind tokKind
	text string
	num  float64
	pos  int
}

func (t token) String() string {
	switch t.kind {
	case tEOF:
		return "end of expression"
	case tNum:
		return "number " + t.text
	}
	return strconv.Quote(t.text)
}

type calcParser struct {
	src   string
	i     int
	tok   token
	depth int
	err   error
}

func (p *calcParser) errorf(format string, a ...any) error {
	return fmt.Errorf("calc: "+format+" at position %d", append(a, p.tok.pos+1)...)
}

// next reads the token at p.i into p.tok; a malformed one also sets p.err.
func (p *calcParser) next() {
	for p.i < len(p.src) && strings.IndexByte(" \t\r\n", p.src[p.i]) >= 0 {
		p.i++
	}
	start := p.i
	if p.i >= len(p.src) {
		p.tok = token{kind: tEOF, pos: start}
		return
	}
	c := p.src[p.i]
	switch {
	case c == '0' && p.i+1 < len(p.src) && (p.src[p.i+1] == 'x' || p.src[p.i+1] == 'X'):
		p.hexNumber(start)
	case c >= '0' && c <= '9' || c == '.':
		p.number(start)
	case isIdentStart(c):
		for p.i < len(p.src) && (isIdentStart(p.src[p.i]) || isDigit(p.src[p.i])) {
			p.i++
		}
		p.tok = token{kind: tIdent, text: p.src[start:p.i], pos: start}
	case c == '*' && p.i+1 < len(p.src) && p.src[p.i+1] == '*':
		p.i += 2
		p.tok = token{kind: tOp, text: "^", pos: start}
	case strings.IndexByte("+-*/%^(),", c) >= 0:
		p.i++
		p.tok = token{kind: tOp, text: string(c), pos: start}
	default:
		r := []rune(p.src[p.i:])[0]
		p.tok = token{kind: tOp, text: string(r), pos: start}
		p.err = fmt.Errorf("calc: unexpected character %q at position %d", r, start+1)
	}
}

// hexNumber reads a 0x literal starting at start.
func (p *calcParser) hexNumber(start int) {
	p.i += 2
	for p.i < len(p.src) && isHex(p.src[p.i]) {
		p.i++
	}
	n, err := strconv.ParseUint(p.src[start+2:p.i], 16, 64)
	if err != nil {
		p.tok = token{kind: tOp, text: p.src[start:p.i], pos: start}
		p.err = fmt.Errorf("calc: bad hexadecimal number %q at position %d", p.src[start:p.i], start+1)
		return
	}
	p.tok = token{kind: tNum, text: p.src[start:p.i], num: float64(n), pos: start}
}

// number reads a decimal literal starting at start: digits and dots, then
// an exponent if one with digits follows (1e is the number 1, then e).
func (p *calcParser) number(start int) {
	for p.i < len(p.src) && (isDigit(p.src[p.i]) || p.src[p.i] == '.') {
		p.i++
	}
	if p.i < len(p.src) && (p.src[p.i] == 'e' || p.src[p.i] == 'E') {
		j := p.i + 1
		if j < len(p.src) && (p.src[j] == '+' || p.src[j] == '-') {
			j++
		}
		if j < len(p.src) && isDigit(p.src[j]) {
			for j < len(p.src) && isDigit(p.src[j]) {
				j++
			}
			p.i = j
		}
	}
	text := p.src[start:p.i]
	n, err := strconv.ParseFloat(text, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		p.tok = token{kind: tOp, text: text, pos: start}
		p.err = fmt.Errorf("calc: bad number %q at position %d", text, start+1)
		return
	}
	p.tok = token{kind: tNum, text: text, num: n, pos: start}
}

func isIdentStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool      { return c >= '0' && c <= '9' }
func isHex(c byte) bool        { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

// binding powers: + - 10, * / % 20, unary - 30, ^ 40 (right).
func infix(op string) (left, right int, ok bool) {
	switch op {
	case "+", "-":
		return 10, 11, true
	case "*", "/", "%":
		return 20, 21, true
	case "^":
		return 40, 40, true
	}
	return 0, 0, false
}

func (p *calcParser) expr(minBP int) (float64, error) {
	if p.depth++; p.depth > maxCalcDepth {
		return 0, p.errorf("expression is nested too deeply")
	}
	defer func() { p.depth-- }()
	lhs, err := p.prefix()
	if err != nil {
		return 0, err
	}
	for {
		if p.err != nil {
			return 0, p.err
		}
		if p.tok.kind != tOp {
			if p.tok.kind == tEOF {
				return lhs, nil
			}
			return 0, p.errorf("expected an operator, found %s", p.tok)
		}
		op := p.tok.text
		lbp, rbp, ok := infix(op)
		if !ok || lbp < minBP {
			return lhs, nil
		}
		p.next()
		rhs, err := p.expr(rbp)
		if err != nil {
			return 0, err
		}
		switch op {
		case "+":
			lhs += rhs
		case "-":
			lhs -= rhs
		case "*":
			lhs *= rhs
		case "/":
			if rhs == 0 {
				return 0, errors.New("calc: division by zero")
			}
			lhs /= rhs
		case "%":
			if rhs == 0 {
				return 0, errors.New("calc: modulo by zero")
			}
			lhs = math.Mod(lhs, rhs)
		case "^":
			lhs = math.Pow(lhs, rhs)
		}
	}
}

func (p *calcParser) prefix() (float64, error) {
	if p.err != nil {
		return 0, p.err
	}
	t := p.tok
	switch t.kind {
	case tEOF:
		return 0, p.errorf("unexpected end of expression")
	case tNum:
		p.next()
		return t.num, nil
	case tIdent:
		p.next()
		name := strings.ToLower(t.text)
		if p.tok.kind == tOp && p.tok.text == "(" {
			return p.call(name, t)
		}
		switch name {
		case "pi":
			return math.Pi, nil
		case "e":
			return math.E, nil
		case "tau":
			return 2 * math.Pi, nil
		case "inf", "infinity":
			return math.Inf(1), nil
		}
		p.tok = t
		return 0, p.errorf("unknown name %q (calc has no variables; constants are pi, e and tau)", t.text)
	}
	switch t.text {
	case "-", "+":
		p.next()
		v, err := p.expr(30)
		if t.text == "-" {
			v = -v
		}
		return v, err
	case "(":
		p.next()
		v, err := p.expr(0)
		if err != nil {
			return 0, err
		}
		if p.tok.kind != tOp || p.tok.text != ")" {
			return 0, p.errorf("expected ')', found %s", p.tok)
		}
		p.next()
		return v, nil
	}
	return 0, p.errorf("unexpected %s", t)
}

var calcFuncs = map[string]func(a []float64) (float64, error){
	"abs": unary(math.Abs), "sqrt": unary(math.Sqrt), "cbrt": unary(math.Cbrt), "exp": unary(math.Exp),
	"ln": unary(math.Log), "log": unary(math.Log10), "log10": unary(math.Log10), "log2": unary(math.Log2),
	"sin": unary(math.Sin), "cos": unary(math.Cos), "tan": unary(math.Tan),
	"asin": unary(math.Asin), "acos": unary(math.Acos), "atan": unary(math.Atan),
	"floor": unary(math.Floor), "ceil": unary(math.Ceil), "trunc": unary(math.Trunc),
	"round": unary(func(x float64) float64 { return math.Floor(x + 0.5) }),
	"sign": unary(func(x float64) float64 {
		switch {
		case x > 0:
			return 1
		case x < 0:
			return -1
		}
		return x
	}),
	"pow": binary(math.Pow), "hypot": binary(math.Hypot), "atan2": binary(math.Atan2),
	"min": variadic(math.Min), "max": variadic(math.Max),
}

func unary(f func(float64) float64) func([]float64) (float64, error) {
	return func(a []float64) (float64, error) {
		if len(a) != 1 {
			return 0, fmt.Errorf("takes 1 argument, not %d", len(a))
		}
		return f(a[0]), nil
	}
}

func binary(f func(x, y float64) float64) func([]float64) (float64, error) {
	return func(a []float64) (float64, error) {
		if len(a) != 2 {
			return 0, fmt.Errorf("takes 2 arguments, not %d", len(a))
		}
		return f(a[0], a[1]), nil
	}
}

func variadic(f func(x, y float64) float64) func([]float64) (float64, error) {
	return func(a []float64) (float64, error) {
		if len(a) == 0 {
			return 0, errors.New("takes at least 1 argument")
		}
		v := a[0]
		for _, x := range a[1:] {
			v = f(v, x)
		}
		return v, nil
	}
}

func (p *calcParser) call(name string, at token) (float64, error) {
	f, ok := calcFuncs[name]
	if !ok {
		p.tok = at
		return 0, p.errorf("unknown function %q", at.text)
	}
	p.next() // (
	var args []float64
	if !(p.tok.kind == tOp && p.tok.text == ")") {
		for {
			v, err := p.expr(0)
			if err != nil {
				return 0, err
			}
			args = append(args, v)
			if p.tok.kind == tOp && p.tok.text == "," {
				p.next()
				continue
			}
			break
		}
	}
	if p.tok.kind != tOp || p.tok.text != ")" {
		return 0, p.errorf("expected ')' or ',', found %s", p.tok)
	}
	p.next()
	v, err := f(args)
	if err != nil {
		return 0, fmt.Errorf("calc: %s %v", at.text, err)
	}
	return v, nil
}
