"""A meshd model folder on disk, whatever the model: the base that generative models
(``meshd.engine``) and embedding models (``meshd.embed``) both stand on.

A model folder holds ``manifest.json``, one ``weights.bin`` of 64-byte-aligned tensors that
ONNX graphs read as external data, a ``tokenizer.json`` and graph files (docs/model-format.md,
docs/embeddings.md). What is the same for every kind lives here: the manifest's tensor list,
file names and atomic writing (``manifest``), the weights file (``weights``), the checkpoint
reader (``safetensors_io``), building a folder in a temporary sibling and renaming it into
place (``importing``), the builder of graphs over the weights file (``onnx_graph``), the
architecture checks every kind makes (``arch``), and the onnxruntime providers a session
runs on (``providers``). The kinds' own manifests, architectures and graphs stay in their
packages, which never import each other.
"""
