package terminal

import "strings"

// shellLib is defined once in the resident shell, which never calls its
// functions: every command's subshell, a fork of it, has them without
// parsing them again (that parse was a sixth of a command's CPU). They
// were parsed before any alias existed, so a restored alias cannot expand
// inside them; a command may redefine them in its own subshell, which
// ends with it.
//
// __quro_dump MODE STATUS [ARGS...] writes the subshell's state to the
// state pipe and exits with STATUS: MODE k keeps the state for the next
// command, x says the command ended its shell (exit, set -e) and the next
// command gets a new one. Variables that bash maintains itself are left
// out; the shell options come last so that set -e or set -u do not apply
// while the next subshell restores the rest. Only what differs from the
// resident shell (see shellBaseline) is dumped: a subshell is its fork and
// has the rest already. Functions come before
// aliases, which would otherwise expand inside them. Bash writes its
// builtins' output a line at a time, and each write to the state socket
// wakes the server: so the dump is built in variables (${v@A}, the alias
// table, $BASHOPTS and $SHELLOPTS against the resident shell's) and only
// arrays, namerefs, functions, umask and traps are printed by builtins.
// The library's own functions are unset first, so they are not dumped.
//
// __quro_exit is the EXIT trap: the command exited (exit, set -e, set -u,
// a fatal error). exit and set -e end the shell as they would in a
// terminal (the next command gets a new one, in the last directory); the
// exit function marks the first, since bash tells the trap nothing.
// __quro_int is the SIGINT trap: the interrupt ends the command, as it
// would in an interactive shell, and keeps what it changed.
var shellLib = `__quro_dump() {
builtin local __quro_m=$1 __quro_st=$2 __quro_v __quro_x __quro_o= __quro_r= __quro_p=
builtin local -a __quro_a; __quro_a=()
builtin shift 2
builtin trap - EXIT
builtin unset -f __quro_exit __quro_int exit __quro_dump __quro_post
if [[ $__quro_m == k ]]; then
# IFS first: the loop below splits with its own.
if [[ -v IFS ]]; then
__quro_x=${IFS@A}
[[ $__quro_x != "${__quro_base[IFS]-}" ]] && __quro_o+=$__quro_x$'\n'
else
__quro_o+=$'builtin unset -v IFS\n'
fi
builtin local IFS=$' \t\n'
# The names without a fork: $(compgen -v) costs a fork of the shell and
# a write per name, twenty times the CPU of these expansions.
for __quro_v in ` + varPrefixes() + `; do
[[ $__quro_v == __quro_* || $__quro_v == IFS || -n ${__quro_own[$__quro_v]-} ]] && continue
__quro_x=${!__quro_v@a}
if [[ -R $__quro_v || $__quro_x == *[aA]* ]]; then
__quro_a+=("$__quro_v")
else
__quro_x=${!__quro_v@A}
[[ -n $__quro_x && $__quro_x != "${__quro_base[$__quro_v]-}" ]] && __quro_o+=$__quro_x$'\n'
fi
done
for __quro_v in "${!__quro_base[@]}"; do
[[ $__quro_v == IFS || -v $__quro_v ]] || __quro_o+="builtin unset -v $__quro_v"$'\n'
done
for __quro_v in "${!BASH_ALIASES[@]}"; do
__quro_r+="builtin alias -- ${__quro_v@Q}=${BASH_ALIASES[$__quro_v]@Q}"$'\n'
done
__quro_x=
(($#)) && builtin printf -v __quro_x ' %q' "$@"
__quro_r+="builtin set --$__quro_x"$'\n'
__quro_x=
for __quro_v in ${BASHOPTS//:/ }; do [[ :$__quro_shopt0: == *:$__quro_v:* ]] || __quro_x+=" $__quro_v"; done
[[ -n $__quro_x ]] && __quro_p+="builtin shopt -s$__quro_x"$'\n'
__quro_x=
for __quro_v in ${__quro_shopt0//:/ }; do [[ :$BASHOPTS: == *:$__quro_v:* ]] || __quro_x+=" $__quro_v"; done
[[ -n $__quro_x ]] && __quro_p+="builtin shopt -u$__quro_x"$'\n'
__quro_x=
for __quro_v in ${__quro_setopt0//:/ }; do [[ :$SHELLOPTS: == *:$__quro_v:* ]] || __quro_x+=" +o $__quro_v"; done
for __quro_v in ${SHELLOPTS//:/ }; do [[ :$__quro_setopt0: == *:$__quro_v:* ]] || __quro_x+=" -o $__quro_v"; done
[[ -n $__quro_x ]] && __quro_p+="builtin set$__quro_x"$'\n'
fi
{
builtin printf '\0S%s:%s:%s\0B%s' "$__quro_n" "$__quro_m" "$PWD" "$__quro_o"
if [[ $__quro_m == k ]]; then
((${#__quro_a[@]})) && builtin declare -p -- "${__quro_a[@]}"
builtin declare -f
builtin printf '%s' "$__quro_r"
builtin umask -p
builtin trap -p
builtin printf '%s' "$__quro_p"
fi
builtin printf '\0'
} >&6 2>/dev/null
builtin exit "$__quro_st"
}
__quro_exit() {
builtin local __quro_st=$? __quro_m=k
if [[ ${__quro_x-} == 1 ]]; then __quro_m=x; builtin printf 'exit\n' >&2; fi
case $- in *e*) __quro_m=x ;; esac
__quro_dump "$__quro_m" "$__quro_st"
}
exit() {
builtin local __quro_st=$?
__quro_x=1
(($#)) || builtin set -- "$__quro_st"
builtin exit "$@"
}
__quro_int() {
__quro_dump k 130
}
`

// shellPre is the prologue of every command's subshell: the resident
// shell keeps its text in a variable (__quro_pre), and the frame of a
// command is only "( eval pre; eval command; dump )", forked ahead of the
// command, and a call of __quro_post, so that the resident shell reads a
// short line per command. The subshell first waits for a line on fd 8
// (the go pipe, which only the server writes, once fd 7 holds the
// command; at end of file it exits: the shell is closing). What changes
// from one command to the next comes from fd 7,
// the memfd only the server writes (see Shell.stateFields): the command,
// the state nonce, the directory, the session's variables that changed,
// whether stderr is split, and the state to restore. Every descriptor but
// 0, 1, 2 and the state socket is closed (with exec, which keeps no saved
// copies) before the state is restored and before any user code runs.
const shellPre = `builtin read -r -u 8 __quro_g || builtin exit 0
IFS= builtin read -r -d '' -u 7 __quro_c
IFS= builtin read -r -d '' -u 7 __quro_n
IFS= builtin read -r -d '' -u 7 __quro_d
IFS= builtin read -r -d '' -u 7 __quro_v
IFS= builtin read -r -d '' -u 7 __quro_2
IFS= builtin read -r -d '' -u 7 __quro_s
if [[ $__quro_2 == 1 ]]; then exec 0<&4 2>&5; else exec 0<&4; fi
for __quro_f in /proc/self/fd/*; do __quro_f=${__quro_f##*/}; case $__quro_f in 0|1|2|6) ;; *) exec {__quro_f}>&- ;; esac; done
builtin printf '\0H%s\0' "$__quro_n" >&6
builtin cd -- "$__quro_d" 2>/dev/null || :
builtin trap __quro_int INT
builtin eval "$__quro_s" 2>/dev/null; builtin unset __quro_s
builtin trap __quro_exit EXIT
builtin eval "$__quro_v" 2>/dev/null; builtin unset __quro_v __quro_d __quro_2
`

// shellPost is defined in the resident shell: "__quro_post STATUS NONCE
// TOKEN SPLIT" runs there once the subshell has exited. It draws the end
// marker only now (nothing the command left behind can know it), writes
// it to the state stream, the sync token (\0QS<TOKEN>\0) to the output
// (and to the split stderr when SPLIT is 1), and the status record
// "NONCE:STATUS:MARKER\0" to fd 3, with the subshell's real status.
const shellPost = `__quro_post() {
builtin local __quro_m=${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}${SRANDOM:-$RANDOM}
builtin printf '\0E%s\0' "$__quro_m" >&6
builtin printf '\0QS%s\0' "$3"
[[ $4 == 1 ]] && builtin printf '\0QS%s\0' "$3" >&5
builtin printf '%s:%d:%s\0' "$2" "$1" "$__quro_m" >&3
}
`

// bashOwnVars are the variables that bash keeps itself, never carried
// over (nor are Quro's own, __quro_*). The dump looks them up in an
// associative array: a case with this many patterns cost more than the
// rest of the dump.
var bashOwnVars = strings.Fields("_ BASH BASHOPTS BASHPID BASH_ALIASES BASH_ARGC BASH_ARGV BASH_ARGV0 BASH_CMDS BASH_COMMAND BASH_EXECUTION_STRING BASH_LINENO BASH_REMATCH BASH_SOURCE BASH_SUBSHELL BASH_VERSINFO BASH_VERSION COMP_WORDBREAKS DIRSTACK EPOCHREALTIME EPOCHSECONDS EUID FUNCNAME GROUPS HISTCMD LINENO PIPESTATUS PPID PWD RANDOM SECONDS SHELLOPTS SHLVL SRANDOM UID")

func ownVarsTable() string {
	var b strings.Builder
	b.WriteString("declare -A __quro_own=(")
	for _, v := range bashOwnVars {
		b.WriteString("[" + v + "]=1 ")
	}
	b.WriteString(")\n")
	return b.String()
}

// shellBaseline runs once in the resident shell, on its own pristine
// variables (no user code has run): the declarations and options that
// every subshell inherits anyway, so that a dump carries only what a
// command changed. Values are stored, never evaluated.
var shellBaseline = ownVarsTable() + `__quro_shopt0=$BASHOPTS; __quro_setopt0=$SHELLOPTS
declare -A __quro_base=()
for __quro_v in ` + varPrefixes() + `; do
[[ $__quro_v == __quro_* || -n ${__quro_own[$__quro_v]-} ]] && continue
[[ -R $__quro_v || ${!__quro_v@a} == *[aA]* ]] || __quro_base[$__quro_v]=${!__quro_v@A}
done
`

// varPrefixes expands to every variable name: "${!a@}" … "${!_@}".
func varPrefixes() string {
	var b strings.Builder
	for _, c := range "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_" {
		b.WriteString(`"${!` + string(c) + `@}" `)
	}
	return strings.TrimSpace(b.String())
}
