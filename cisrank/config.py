"""Typed settings: one object per component, filled from CLI flags, `CISRANK_*` env vars or a file.

Process-wide settings (`Settings`) come from the environment; component configs are plain pydantic
models so that the CLI, the API config file and tests all construct them the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Process-wide settings read from `CISRANK_*` environment variables."""

    model_config = SettingsConfigDict(env_prefix="CISRANK_", extra="ignore")

    data_dir: Path | None = Field(
        default=None,
        description="Root holding one folder per dataset (like ../shared/data): trec-dl19/, ...",
    )
    index_dir: Path = Field(default=Path("indexes"), description="Where built indexes live.")
    device: str | None = Field(default=None, description="torch device; auto when unset.")
    log_level: str = Field(default="INFO")
    dense_model: str = Field(default="all-MiniLM-L6-v2", description="Default bi-encoder.")


def get_settings() -> Settings:
    """Settings are read fresh on every call so that tests and the CLI see env changes."""
    return Settings()


class ComponentConfig(BaseModel):
    """Base of every component config: strict about unknown keys so typos fail loudly."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    @classmethod
    def from_file(cls, path: str | Path) -> ComponentConfig:
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))

    def replace(self, **changes: Any) -> ComponentConfig:
        return self.model_copy(update={k: v for k, v in changes.items() if v is not None})


class DenseRerankerConfig(ComponentConfig):
    """A sentence-transformers bi-encoder scored by cosine of normalized embeddings."""

    model: str = "all-MiniLM-L6-v2"
    batch_size: int | None = Field(
        default=None,
        ge=1,
        description="Texts per encoder batch; 16 on CPU (less padding: 1.2x faster than 32 on "
        "DL19 passages, see bench/RESULTS.md), 128 on GPU when unset.",
    )
    device: str | None = None
    max_seq_length: int | None = Field(
        default=None, ge=1, description="Token limit; the model's own (256 for MiniLM) when unset."
    )
    query_prefix: str = ""
    passage_prefix: str = ""
