"""Import a PyTorch model as a tile-level dataflow graph (``doppler graph import``).

:func:`import_model` takes a factory (``module:function``) or a ``.pt2`` file and returns the graph. Its
parts, one concern per module, each importing only those listed before it:

* :mod:`~doppler.importer.files`: the one gate for zip archives and pickles from users (torch's
  weights-only loader, bounded sizes);
* :mod:`~doppler.importer.errors`: :class:`GraphImportError`, the one error of an import;
* :mod:`~doppler.importer.pt2`: a ``.pt2`` archive read without running anything in it;
* :mod:`~doppler.importer.layout`: tiling (``--blocks``) and the zero-FLOP layout steps on tiles;
* :mod:`~doppler.importer.sources`: factories, ``torch.export``, the meta device, saved programs;
* :mod:`~doppler.importer.fusion`: pending elementwise chains, broadcasts and repeats;
* :mod:`~doppler.importer.lowering`: the handler per ATen op, weight binding, :func:`import_model`.

Nothing from a data file is executed: a factory is imported only when named by the caller, and a
``.pt2`` file is read as JSON and raw tensor bytes (no unpickling, no ``torch.export.load``).
"""

from doppler.importer.errors import GraphImportError
from doppler.importer.layout import auto_blocks, parse_blocks
from doppler.importer.lowering import import_model, lower_program, model_inputs, module_path
from doppler.importer.sources import (WRAPPED, checkpoint_keys, export_model, load_factory, load_pt2, parameter_dtype,
                                      parameters_on_meta, parse_input_shapes, without_cache)

__all__ = ["GraphImportError", "WRAPPED", "auto_blocks", "checkpoint_keys", "export_model",
           "import_model", "load_factory", "load_pt2", "lower_program", "model_inputs", "module_path",
           "parameter_dtype", "parameters_on_meta", "parse_blocks", "parse_input_shapes", "without_cache"]
