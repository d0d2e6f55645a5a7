"""Where model weights come from and how they load: name resolution, fingerprints, encoders.

Every loader of the project lives here, below the rerankers and retrievers that use them, so a
bi-encoder loads the same way for dense reranking and dense indexing.
"""
