"""Units of memory, in bytes: the package's one definition of each."""

KIB = 2**10
MIB = 2**20
GIB = 2**30
TIB = 2**40


def size_text(size_bytes: float) -> str:
  """'1.25 GiB', or '3.4 MiB' below a GiB."""
  if size_bytes >= GIB:
    return f'{size_bytes / GIB:.2f} GiB'
  return f'{size_bytes / MIB:.1f} MiB'
