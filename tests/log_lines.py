"""The absl log lines a block of code writes, for tests that check what a
run reports."""
import contextlib
import logging


@contextlib.contextmanager
def absl_lines():
  """The absl log lines (INFO and up) written inside the block."""
  lines = []

  class Keep(logging.Handler):
    def emit(self, record):
      lines.append(record.getMessage())

  logger = logging.getLogger("absl")
  handler, level = Keep(logging.INFO), logger.level
  logger.addHandler(handler)
  logger.setLevel(logging.INFO)
  try:
    yield lines
  finally:
    logger.removeHandler(handler)
    logger.setLevel(level)
