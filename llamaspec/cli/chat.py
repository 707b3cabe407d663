"""`llamaspec chat` (and `llamaspec run MODEL` at a terminal with no prompt): an interactive chat on
the model's chat template, as `ollama run` does, with speculation on as in `run`.

Each turn sends the whole conversation; the engine keeps the sequence's tokens in the KV cache and
evaluates only what differs from them, so a turn costs its new tokens (the footer's `prompt N
tokens`). A conversation past the context loses its oldest turns (the system message stays); the
transcript that /save writes keeps them.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import typer

from llamaspec.cli._chat_session import (
    HELP, Message, MultiLine, Totals, answer_room, fit_history, footer, save_messages,
)
from llamaspec.cli._generation import ColorOpt, TargetArg, generation_flags
from llamaspec.cli._options import draft_size_warning, ngram_flags, output_flags
from llamaspec.cli._output import Output, escape
from llamaspec.cli.app import app
from llamaspec.errors import ContextFullError, LlamaspecError, UsageError

if TYPE_CHECKING:
    from llamaspec.api.options import GenerationOptions
    from llamaspec.api.generator import Generator, Result
    from llamaspec.speculative.options import NgramParams

EXIT_HINT = "Use Ctrl + d or /bye to exit."


@app.command()
@output_flags
@ngram_flags
@generation_flags
def chat(
    model: TargetArg = None,
    color: ColorOpt = False,
    *,
    gen: GenerationOptions,
    ngram: NgramParams,
    out: Output,
) -> None:
    """Chat with a model on its chat template (>>> prompt, /? for help, Ctrl-D to leave); run's flags."""
    open_chat(model, replace(gen, ngram=ngram), out, color)


def open_chat(model: str | None, options: GenerationOptions, out: Output, color: bool) -> None:
    """Load the models as `run` does and chat until /bye, /exit or Ctrl-D."""
    if options.chat is False:
        raise UsageError("chat needs the model's chat template", "drop --raw, or use `llamaspec run -p` for plain text")
    from llamaspec.api.generator import Generator
    from llamaspec.runtime.llama import set_llama_log

    set_llama_log()
    with Generator.from_options(model, options) as g:
        for note in g.notes:
            out.info(note)
        r = g.resolved
        for line in r.details:   # why this draft, and where drafts were looked for (-v, as run)
            out.detail(line)
        if warning := draft_size_warning(r.target_path, r.draft_path):
            out.warn(warning)
        out.detail(f"target {r.target_path}; spec {g.spec_label}; draft {r.draft_path}")
        if not g.pipeline.target.chat_template:
            raise UsageError(f"{r.target_path.name} has no chat template, so it cannot chat",
                             "use `llamaspec run -p TEXT` for plain completion")
        session = ChatSession(g, out, color=color, system=options.system)
        if sys.stdin.isatty():
            out.info(f"[dim]{escape(r.target_path.name)}, spec {escape(g.spec_label)}, context {g.n_ctx} "
                     "tokens. /? for help, Ctrl + d to exit.[/dim]")
        session.loop(_line_reader(out))


def _line_reader(out: Output) -> Callable[[str], str]:
    """input() with line editing and history (readline) at a terminal; plain lines otherwise (a
    piped chat: one message a line, no prompt). Bytes that are not UTF-8 (which Python's stdin
    hands over as surrogates, or raw) are replaced by U+FFFD and noted. Raises EOFError at the end."""
    count = [0]

    def utf8(raw: str | bytes) -> str:
        count[0] += 1
        data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            out.warn(f"line {count[0]} of the input is not valid UTF-8: the bad bytes were replaced by U+FFFD")
            return data.decode("utf-8", errors="replace")

    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401 - importing it gives input() editing and history
        except ImportError:   # (Windows without pyreadline: input() still works)
            pass
        return lambda prompt: utf8(input(prompt))

    binary = getattr(sys.stdin, "buffer", None)   # (a test's StringIO has none: text already)

    def read(prompt: str) -> str:
        raw = binary.readline() if binary is not None else sys.stdin.readline()
        if not raw:
            raise EOFError
        return utf8(raw).rstrip("\r\n")

    return read


class ChatSession:
    """The conversation, its totals and the commands; `loop` reads lines until the user leaves."""

    def __init__(self, g: Generator, out: Output, *, color: bool = False, system: str | None = None):
        self.g, self.out, self.color = g, out, color
        self.head: list[Message] = [{"role": "system", "content": system}] if system else []
        self.messages: list[Message] = list(self.head)     # what fits the context, sent each turn
        self.transcript: list[Message] = list(self.head)   # every turn, for /save
        self.totals = Totals()

    # -- the loop ----------------------------------------------------------------------------
    def loop(self, read: Callable[[str], str]) -> None:
        multi = MultiLine()
        while True:
            try:
                line = read("... " if multi.active else ">>> ")
            except EOFError:   # Ctrl-D
                self.out.write("\n" if sys.stdin.isatty() else "")
                return
            except KeyboardInterrupt:   # Ctrl-C at the prompt: ollama's hint, and the chat goes on
                multi.cancel()
                self.out.write("\n")
                self._check_terminated()
                self.out.info(EXIT_HINT)
                continue
            except UnicodeDecodeError:   # a terminal sent bytes that are not UTF-8: that line only
                self.out.warn("that line was not valid UTF-8 and was ignored")
                continue
            if not multi.active and line.strip().startswith("/"):
                if self.command(line.strip()):
                    return
                continue
            text = multi.feed(line)
            if text is not None and text.strip():
                try:
                    self.turn(text)
                except KeyboardInterrupt:   # outside the answer (the template, the footer): no turn
                    self.out.write("\n")
                    self._check_terminated()

    def command(self, line: str) -> bool:
        """Run a /command; True means leave."""
        name, _, arg = line.partition(" ")
        name, arg = name.lower(), arg.strip()
        if name in ("/bye", "/exit", "/quit"):
            return True
        if name == "/clear":
            self.messages, self.transcript = list(self.head), list(self.head)
            self.out.info("Cleared the conversation.")
        elif name == "/stats":
            self.out.write("\n".join(self.totals.lines()) + "\n")
        elif name in ("/save", "/save!"):
            self._save(arg, overwrite=name == "/save!")
        elif name in ("/?", "/help"):
            self.out.write(HELP + "\n")
        else:
            self.out.info(f"Unknown command '{escape(name)}'. Type /? for help")
        return False

    def _save(self, arg: str, overwrite: bool) -> None:
        if not arg:
            self.out.info("Usage: /save FILE (/save! FILE overwrites)")
            return
        path = Path(arg).expanduser()
        try:
            save_messages(path, self.transcript, overwrite=overwrite)
        except FileExistsError:
            self.out.warn(f"{escape(path)} exists; /save! {escape(arg)} overwrites it")
            return
        except OSError as e:   # a bad path is one line; the chat goes on
            self.out.warn(f"cannot write {escape(path)}: {escape(e.strerror or e)}")
            return
        self.out.info(f"saved {len(self.transcript)} messages to {escape(path)}")

    # -- one turn ----------------------------------------------------------------------------
    def turn(self, text: str) -> None:
        from llamaspec.cli._errors import explain

        try:
            messages = self._fit(self.messages + [{"role": "user", "content": text}])
            result = self._generate(messages)
        except LlamaspecError as e:   # a template error, a message too long: this turn only
            self.out.error(explain(e))
            return
        if result is None or (result.stop_reason == "interrupted" and not result.tokens):
            # interrupted before the answer began (the prompt's evaluation): the question is dropped
            self.out.write("\n")
            self._check_terminated()
            self.out.info("interrupted before the answer began: that message is not kept")
            return
        answer = {"role": "assistant", "content": result.text}
        self.messages = messages + [answer]
        self.transcript += [messages[-1], answer]
        info = {"text": result.text, "stop_reason": result.stop_reason, "n_prompt": result.n_prompt, **result.stats}
        self.totals.add(info)
        if self.out.json:
            self.out.data(info)
        else:
            self.out.write("\n")
            if not self.out.quiet:
                self.out.stderr.print(f"[dim]{escape(footer(info))}[/dim]")
            self.out.write("\n")
        if result.stop_reason == "interrupted":
            self._check_terminated()

    def _generate(self, messages: list[Message]) -> Result | None:
        """The answer, streamed; Ctrl-C keeps the part written (the engine returns it as
        "interrupted", or raises a KeyboardInterrupt that carries it as `.result`)."""
        on_text = None if self.out.json else self._streamer()
        try:
            return self.g.generate(messages, on_text=on_text)
        except KeyboardInterrupt as exc:
            return getattr(exc, "result", None)

    def _streamer(self) -> Callable[[str, bool, str], None]:
        write = self.out.write
        if not self.color:
            return lambda piece, from_draft, source: write(piece)
        green, reset = "\x1b[32m", "\x1b[0m"
        return lambda piece, from_draft, source: write(f"{green}{piece}{reset}" if from_draft else piece)

    def _fit(self, messages: list[Message]) -> list[Message]:
        """The conversation cut to fit the context, oldest turns first, with room for an answer."""
        n_ctx = self.g.n_ctx

        def count(m: list[Message]) -> int:
            return len(self.g.tokenize(m))

        kept, dropped = fit_history(messages, count, n_ctx - answer_room(n_ctx, self.g.max_tokens))
        n = count(kept)
        if n >= n_ctx:   # the message alone (with the system message) is too long: nothing is dropped
            raise ContextFullError(f"this message makes a prompt of {n:,} tokens; the context holds {n_ctx:,}",
                                   "send a shorter message, /clear, or raise -c/--ctx-size")
        if dropped:
            what = "the oldest turn" if dropped == 1 else f"the {dropped} oldest turns"
            self.out.info(f"dropped {what} of the conversation to fit the context of {n_ctx} tokens")
        return kept

    def _check_terminated(self) -> None:
        """SIGTERM ends the chat (143); Ctrl-C only ends the answer."""
        from llamaspec.cli._errors import interrupted_exit_code
        from llamaspec.errors import EXIT_TERMINATED

        if interrupted_exit_code() == EXIT_TERMINATED:
            raise typer.Exit(EXIT_TERMINATED)
