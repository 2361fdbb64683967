"""Inference, one module per task, each shaped like its `transformers` / sentence-transformers / TEI counterpart.

Every pipeline takes texts (`tokenizer.encode_batch` once) or encodings already made (the server tokenizes each
request once, outside the model's thread, and hands the encodings over), splits inputs longer than the context into
windows (`data/windows.py`), and runs them through `run_batches`, the one batching loop.

    embed.SentenceEncoder     sentence vectors (sentence-transformers' encode)
    classify                  labels and scores, pairs, reranking (TEI's /predict and /rerank)
    tag                       entities with character offsets (the token-classification pipeline)
    fill_mask                 fillers for [MASK] (the fill-mask pipeline)
"""
