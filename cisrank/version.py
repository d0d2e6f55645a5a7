"""The package version, in a leaf module: the records that carry it (index manifests, run and
model provenance) import it from here, so no floor imports the top-level package, whose Python API
(`cisrank.load_reranker`) sits above them all."""

__version__ = "0.1.0"
