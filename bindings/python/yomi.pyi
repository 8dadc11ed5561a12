"""yomi, a fast local LLM inference engine (type stubs of the compiled module)."""

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, Optional, Union, overload

__version__: str

class YomiError(RuntimeError):
    """An error of the yomi engine, with its one-line message."""

class GenerationResult:
    """What `Model.generate` returns."""

    @property
    def text(self) -> str: ...
    @property
    def tokens(self) -> list[int]:
        """The generated token ids."""
    @property
    def prompt_tokens(self) -> list[int]:
        """The prompt's token ids (after the chat template, if any)."""
    @property
    def finish_reason(self) -> Literal["stop", "length", "cancelled"]: ...
    @property
    def stats(self) -> dict[str, Any]:
        """The keys and values of `yomi run --json`'s "stats"."""

class Stream(Iterator[str]):
    """The text pieces of `Model.generate(..., stream=True)`."""

    def __iter__(self) -> "Stream": ...
    def __next__(self) -> str: ...
    @property
    def result(self) -> Optional[GenerationResult]:
        """The whole result once the stream is exhausted (None before)."""
    @property
    def stats(self) -> Optional[dict[str, Any]]:
        """The stats once the stream is exhausted (None before)."""
    def close(self) -> None:
        """Stops the generation early (finish reason "cancelled")."""

Message = Mapping[str, Optional[str]]

class Model:
    """A loaded model: a Hugging Face directory, a .gguf file or `hf:ORG/NAME[@REV][:FILE]`."""

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]"],
        device: Literal["auto", "cpu", "cuda"] = "auto",
        *,
        ctx_size: Optional[int] = None,
        threads: Optional[int] = None,
        kv_cache: Literal["f16", "f32"] = "f16",
        draft_model: Union[str, "os.PathLike[str]", None] = None,
        draft_tree: Literal["tree", "chain", "mixed"] = "tree",
        mtp_steps: Optional[int] = None,
    ) -> None: ...
    @property
    def device(self) -> str:
        """Where the model runs, in words (as `yomi run --json`'s "device")."""
    @property
    def path(self) -> str: ...
    @property
    def context_size(self) -> int: ...
    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[Message]],
        *,
        max_tokens: int = 512,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        min_p: Optional[float] = None,
        seed: Optional[int] = None,
        draft: Literal["suffix", "dflash", "mtp", "none"] = "suffix",
        draft_budget: int = 16,
        stop: Union[str, Sequence[str], None] = None,
        enable_thinking: Optional[bool] = None,
        stream: Literal[False] = False,
    ) -> GenerationResult: ...
    @overload
    def generate(
        self,
        prompt: Union[str, Sequence[Message]],
        *,
        max_tokens: int = 512,
        temperature: Optional[float] = None,
        top_p: Optional[float] = None,
        top_k: Optional[int] = None,
        min_p: Optional[float] = None,
        seed: Optional[int] = None,
        draft: Literal["suffix", "dflash", "mtp", "none"] = "suffix",
        draft_budget: int = 16,
        stop: Union[str, Sequence[str], None] = None,
        enable_thinking: Optional[bool] = None,
        stream: Literal[True],
    ) -> Stream: ...
