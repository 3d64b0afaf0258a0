"""vespo's command lines: their conventions, shared by every command (`vespo.cli` dispatches to them) and by the
benchmarks and examples. Every parse error is one line naming the nearest flags (`parse_flags` for a dataclass
through tyro, `ArgumentParser` for argparse); old flag names (`RENAMED`) print one deprecation line
(`warn_renamed`); two names of one setting in one line are refused (`two_spellings`). Imports nothing of vespo, so
any module may use it; tyro is imported only when a dataclass is parsed.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

C = TypeVar("C")


class UsageError(ValueError):
    """A command line that cannot be parsed, as one line; the command prints it after `<prog>: error:` and exits
    with code 2."""


def _flag_key(name: str) -> str:
    """A flag as tyro and HfArgumentParser match it: `--run_dir` is `--run-dir`."""
    return name.split("=", 1)[0].replace("_", "-")


def _looks_like_flag(token: str) -> bool:
    """`--name`, `--name=value` or `-n`; not a value such as -1, -1e-3 or -inf."""
    try:
        float(token)
    except ValueError:
        return re.match(r"--?[A-Za-z]", token) is not None
    return False


def nearest(name: str, known: Iterable[str]) -> list[str]:
    """The up to 3 names of `known` closest to a misspelt `name` (difflib), closest first."""
    import difflib

    return difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)


def unknown_flag(argv: Iterable[str], accepted: Iterable[str]) -> str | None:
    """'unknown flag --x; nearest: --y, --z' for the first token of `argv` that looks like a flag (`--name`,
    `--name=value`, `-n`; negative numbers are values) and is not `accepted`; None when every flag is known."""
    known = {_flag_key(a).lstrip("-"): _flag_key(a) for a in accepted}  # matched without the dashes
    for token in argv:
        name = _flag_key(token).lstrip("-")
        if not _looks_like_flag(token) or name in known:
            continue
        near = nearest(name, (k for k in known if name.startswith("no-") or not k.startswith("no-")))  # --no-x: --no
        hint = f"; nearest: {', '.join(known[n] for n in near)}" if near else ""
        return f"unknown flag {token.split('=', 1)[0]}{hint}"
    return None


def from_text(text: str, hint: object) -> object:
    """`text` (a command-line token, a sweep's extra setting) as the first type of annotation `hint` it reads as:
    None for "None" or "null" where None is accepted, a bool for "true"/"false" (any case), an int, a float; else
    the text itself (a string, a `Literal`'s member, or text for the caller's type check to refuse in its own
    words). The one text-to-value rule of vespo's command lines."""
    import types
    import typing

    origin = typing.get_origin(hint)
    kinds = typing.get_args(hint) if origin in (typing.Union, types.UnionType) else (hint,)
    for kind in kinds:
        if kind is type(None) and text in ("None", "null"):
            return None
        if kind is bool and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if kind in (int, float):
            with contextlib.suppress(ValueError):
                return kind(text)
    return text


class _Renamed:
    """The type of `RENAMED`."""


RENAMED = _Renamed()
"""`Annotated` marker beside `tyro.conf.arg(aliases=...)`: those aliases are the field's old names, still accepted;
each one given prints one deprecation line (`parse_flags`, `warn_renamed`)."""


def _fields(config: type, prefix: str = "") -> Iterator[tuple[str, str, tuple[str, ...], bool, tuple]]:
    """(field path, its flag, the flag's aliases, whether it is a bool, its `Annotated` metadata) for each field tyro
    makes a flag of: a nested dataclass's fields as `--field.sub`, `tyro.conf.arg(name=...)` renaming the flag, and
    `tyro.conf.Suppress` fields left out."""
    import dataclasses
    import typing

    import tyro

    hints = typing.get_type_hints(config, include_extras=True)
    for f in dataclasses.fields(config):
        hint, meta = hints[f.name], ()
        if typing.get_origin(hint) is typing.Annotated:
            hint, *meta = typing.get_args(hint)
        if any(m is tyro.conf.Suppress for m in meta):
            continue
        if dataclasses.is_dataclass(hint):
            yield from _fields(hint, f"{prefix}{f.name}.")
            continue
        name = next((m.name for m in meta if getattr(m, "name", None)), f.name)
        aliases = () if prefix else tuple(a for m in meta for a in getattr(m, "aliases", None) or ())
        yield f"{prefix}{f.name}", f"--{prefix}{name}".replace("_", "-"), aliases, hint is bool, tuple(meta)


def attribute_docstrings(cls: type) -> dict[str, str]:
    """The attribute docstrings of a dataclass (the string right after each field), as `inspect.cleandoc` writes
    them."""
    import ast
    import inspect
    import textwrap

    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    return {
        node.target.id: inspect.cleandoc(after.value.value)
        for node, after in zip(body, body[1:], strict=False)
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
    }


def flat_dataclass(name: str, sections: Iterable[type], *, module: str, doc: str) -> type:
    """One frozen dataclass with every field of the dataclasses `sections`, in order, unchecked (no
    `__post_init__`): what tyro parses where the command line speaks flat names (`--lr`) for a config in sections.
    Each field keeps its annotation (with `tyro.conf.arg` and other markers) and default, and takes its attribute
    docstring as its `--help` text."""
    import dataclasses
    import typing

    import tyro

    specs = []
    for section in sections:
        hints, docs = typing.get_type_hints(section, include_extras=True), attribute_docstrings(section)
        for f in dataclasses.fields(section):
            hint, meta = hints[f.name], []
            if typing.get_origin(hint) is typing.Annotated:
                hint, *meta = typing.get_args(hint)
            own = [m for m in meta if type(m) is type(tyro.conf.arg())]  # a field's own tyro.conf.arg takes the help
            meta = [dataclasses.replace(m, help=docs[f.name]) if m in own else m for m in meta]
            meta = meta if own else [tyro.conf.arg(help=docs[f.name]), *meta]
            default = dataclasses.field(default=f.default, default_factory=f.default_factory)
            specs.append((f.name, typing.Annotated[(hint, *meta)], default))
    flat = dataclasses.make_dataclass(name, specs, frozen=True, namespace={"__doc__": doc})
    flat.__module__ = module  # where it is defined, for pickling and messages
    return flat


def renamed_flags(config: type) -> dict[str, str]:
    """Old flag -> current flag for the top-level fields of `config` marked `RENAMED`."""
    fields = _fields(config)
    return {a: flag for _, flag, aliases, _, meta in fields if any(m is RENAMED for m in meta) for a in aliases}


def warn_renamed(prog: str, argv: Iterable[str], renamed: dict[str, str]) -> None:
    """One line on stderr for each old flag name (`renamed`: old -> current) that argv uses, once per flag:
    '<prog>: --old is deprecated; use --current'."""
    old = {_flag_key(a): a for a in renamed}
    for key in dict.fromkeys(_flag_key(t) for t in argv if _looks_like_flag(t)):
        if key in old:
            print(f"{prog}: {old[key]} is deprecated; use {renamed[old[key]]}", file=sys.stderr)


def flag_fields(config: type) -> dict[str, str]:
    """Every spelling of a flag of `config` (`--field`, `--no-field` for a bool, aliases, `--field.sub`; as
    `_flag_key` writes them) -> the field it sets."""
    spellings = {}
    for path, flag, aliases, is_bool, _ in _fields(config):
        for name in (flag, *aliases):
            spellings[_flag_key(name)] = path
            if is_bool:
                head, dot, tail = name[2:].rpartition(".")
                spellings[_flag_key(f"--{head}{dot}no-{tail}")] = path
    return spellings


def field_flags(config: type) -> dict[str, str]:
    """Field -> its flag as `--help` shows it (`tyro.conf.arg(name=...)` honoured), for messages naming a field."""
    return {path: flag for path, flag, *_ in _fields(config)}


def given_fields(config: type, argv: Iterable[str]) -> set[str]:
    """The fields of `config` that argv sets, under any of their spellings (`flag_fields`)."""
    spellings = flag_fields(config)
    return {spellings[_flag_key(t)] for t in argv if _looks_like_flag(t) and _flag_key(t) in spellings}


def dataclass_flags(config: type) -> set[str]:
    """The flags tyro makes of a dataclass: `--field` (and `--no-field` for a bool), the aliases of `tyro.conf.arg`,
    and `--field.sub` for a nested dataclass's fields; `tyro.conf.Suppress` fields have none."""
    return {"-h", "--help", *flag_fields(config)}


def two_spellings(argv: Iterable[str], spellings: dict[str, str]) -> str | None:
    """'--a and --b are two names of one setting' for the first field that argv sets under two of its spellings
    (`spellings`: flag -> field, as `flag_fields` gives them; e.g. an old name beside the new one, where the parser
    would keep the last silently); None when each field is spelt one way."""
    seen: dict[str, str] = {}
    for token in argv:
        key = _flag_key(token)
        if not _looks_like_flag(token) or key not in spellings:
            continue
        first = seen.setdefault(spellings[key], token.split("=", 1)[0])
        if _positive(_flag_key(first), spellings) != _positive(key, spellings):
            return f"{first} and {token.split('=', 1)[0]} are two names of one setting: give one of them"
    return None


def _positive(key: str, spellings: dict[str, str]) -> str:
    """`--no-field` of a bool as `--field`: one name, on and off, where the last given wins (as in argparse)."""
    head, dot, tail = key[2:].rpartition(".")
    positive = f"--{head}{dot}{tail[3:]}"
    return positive if tail.startswith("no-") and spellings.get(positive) == spellings[key] else key


def parse_flags(
    config: type[C], argv: list[str], *, prog: str, description: str, default: C | None = None, also: Iterable[str] = ()
) -> C:
    """`tyro.cli(config)` on argv, with vespo's errors: an unknown flag (with the nearest names, among them `also`,
    flags the caller has read itself), one field given under two spellings (`two_spellings`), a bad or missing value
    raise a one-line UsageError instead of tyro's box. An old name of a `RENAMED` field is read as the field, with
    one deprecation line (`warn_renamed`)."""
    import tyro

    message = unknown_flag(argv, dataclass_flags(config) | set(also))
    if message is not None:
        raise UsageError(f"{message} ({prog} --help lists every flag)")
    message = two_spellings(argv, flag_fields(config))
    if message is not None:
        raise UsageError(message)
    warn_renamed(prog, argv, renamed_flags(config))
    with _tyro_errors_as_usage():
        return tyro.cli(config, args=argv, prog=prog, description=description, default=default)


@contextlib.contextmanager
def _tyro_errors_as_usage() -> Iterator[None]:
    """Turn tyro's parse errors into one-line UsageErrors through its parse-error hook (tyro >= 1.0); with an older
    tyro, or an error this does not know, tyro prints its own message."""
    try:
        from tyro import _errors
    except ImportError:
        _errors = None
    if getattr(_errors, "on_parse_error", None) is None:
        yield
        return

    def hook(event) -> None:
        message = _tyro_message(event, _errors)
        if message is not None:
            raise UsageError(message)

    with _errors.on_parse_error(hook):
        yield


def _tyro_message(event, errors) -> str | None:
    """One line for a tyro parse-error event (`tyro._errors`), or None for one this does not know."""
    try:
        if isinstance(event, errors.InvalidChoice):
            return f"{event.argument.display_name()} must be one of {list(event.choices)}, got {event.value!r}"
        if isinstance(event, errors.BadValue) and event.reason == "too_few_values":
            return f"{event.argument.display_name()} needs {event.argument.lowered.nargs} value(s)"
        if isinstance(event, errors.UnrecognizedArgs):
            return (f"unexpected value(s) {' '.join(event.tokens)}: a flag takes the values after it, and a boolean "
                    "is --name or --no-name")  # fmt: skip
        if isinstance(event, errors.InstantiationFailure):
            where = f"{event.argument.display_name()}: " if event.argument is not None else ""
            message = (str(event.message).strip().splitlines() or ["invalid value"])[0]
            literal = re.fullmatch(r"invalid literal for (int|float)\(\)(?: with base 10)?: (.*)", message)
            if literal is not None:  # Python's words for `int("1e9")`
                message = f"must be {'an integer' if literal[1] == 'int' else 'a number'}, got {literal[2]}"
            return where + message
    except AttributeError:  # a tyro whose events differ: its own message
        return None
    return None


class ArgumentParser(argparse.ArgumentParser):
    """argparse with vespo's errors: one line (no usage block), exit code 2; an unknown flag is named with the nearest
    ones before any other error (a misspelt required flag is not reported as missing)."""

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        options = self._option_string_actions
        for token in args:
            name = token.split("=", 1)[0]
            if not _looks_like_flag(token) or name in options:
                continue
            if self.allow_abbrev and name.startswith("--") and any(o.startswith(name) for o in options):
                continue  # argparse's own prefix match (or its one-line "ambiguous option")
            self.error(f"{unknown_flag([token], options)} ({self.prog} --help lists every flag)")
        return super().parse_known_args(args, namespace)

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")
