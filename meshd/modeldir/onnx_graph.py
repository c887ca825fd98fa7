"""Building an ONNX graph over a model folder's weights file, for every kind of model.

A graph holds no weights: every initializer points into ``weights.bin`` by offset (ONNX
external data), so a graph is made in milliseconds and nothing is stored twice. Float16
storage is widened by a ``Cast`` that onnxruntime folds once when the session is built.
``meshd.engine.graph`` (stage graphs, with 4/8-bit matrix products) and ``meshd.embed.graph``
(the BERT encoder) build on ``GraphBuilder``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from meshd.modeldir.manifest import TensorEntry

OPSET = 17
IR_VERSION = 8
ONNX_DTYPE = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "q4": TensorProto.UINT8,
              "q8": TensorProto.UINT8, "u8": TensorProto.UINT8}


class GraphBuilder:
    """Nodes and initializers of one graph; weights as external data into the weights file."""

    def __init__(self, tensors: Mapping[str, TensorEntry], weights_file: str) -> None:
        self.tensors = tensors
        self.weights_file = weights_file
        self.nodes: list[onnx.NodeProto] = []
        self.inits: dict[str, TensorProto] = {}
        self.fp32: dict[str, str] = {}
        self.count = 0

    def ops(self, op_type: str, inputs: list[str], n_out: int, **attrs: Any) -> list[str]:
        """Add a node; return its ``n_out`` output names."""
        self.count += 1
        outputs = [f"{op_type.lower()}_{self.count}_{k}" for k in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs,
                                           name=f"{op_type}_{self.count}", **attrs))
        return outputs

    def op(self, op_type: str, inputs: list[str], out: str | None = None, **attrs: Any) -> str:
        """Add a one-output node; its output is named ``out`` if given."""
        if out is None:
            return self.ops(op_type, inputs, 1, **attrs)[0]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, inputs, [out],
                                           name=f"{op_type}_{self.count}", **attrs))
        return out

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self.inits:
            self.inits[name] = numpy_helper.from_array(value, name)
        return name

    def raw(self, name: str) -> tuple[str, str]:
        """The stored tensor (external data) and its dtype."""
        entry = self.tensors[name]
        if name not in self.inits:
            t = TensorProto()
            t.name = name
            t.data_type = ONNX_DTYPE[entry.dtype]
            t.dims.extend(entry.shape)
            t.data_location = TensorProto.EXTERNAL
            for key, value in (("location", self.weights_file), ("offset", str(entry.offset)),
                               ("length", str(entry.nbytes))):
                kv = t.external_data.add()
                kv.key, kv.value = key, value
            self.inits[name] = t
        return name, entry.dtype

    def weight(self, name: str) -> str:
        """The tensor as float32 (a Cast for float16 storage, folded by onnxruntime)."""
        if name not in self.fp32:
            raw, dtype = self.raw(name)
            self.fp32[name] = raw if dtype == "fp32" else self.op(
                "Cast", [raw], to=TensorProto.FLOAT)
        return self.fp32[name]
