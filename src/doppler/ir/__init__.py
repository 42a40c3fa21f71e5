"""The intermediate representation: the dataflow graph and its validation, the analyses beside it (levels,
b-level, critical path; the input slices each op reads), the op vocabulary (kernels), assignments and the
file formats (JSON, the DOPPLER text format)."""
