"""The report pieces the analysis commands share."""

import pytest

from linformer_jax.analysis import tables


def test_a_markdown_table_has_a_header_an_aligned_separator_and_a_line_per_row():
  table = tables.markdown_table(
      ('n', 'mode', 'ratio'), [(512, 'train', '1.2x'), (4096, 'eval', '–')], 'rl-'
  )
  assert table.splitlines() == [
      '| n | mode | ratio |',
      '|---:|:---|---|',
      '| 512 | train | 1.2x |',
      '| 4096 | eval | – |',
  ]


def test_an_alignment_for_another_number_of_columns_is_refused():
  with pytest.raises(ValueError, match='names 2 columns, the header 3'):
    tables.markdown_table(('a', 'b', 'c'), [], 'rr')


def test_numbers_and_ratios_as_text():
  assert tables.number_text(1536.0, ',.1f') == '1,536.0'
  assert tables.number_text(3 * 2**20, '.1f', scale=2**20) == '3.0'
  assert tables.number_text(7, 'd') == '7'
  assert tables.number_text(None, '.1f') == tables.MISSING
  assert tables.number_text(None, '.1f', missing='') == ''
  assert tables.number_text(float('nan'), '.1f') == 'nan'
  assert tables.ratio_text(5.0, 2.0) == '2.5x'
  assert tables.ratio_text(5.0, 3.0, 2) == '1.67x'
  assert tables.ratio_text(None, 2.0) == tables.ratio_text(5.0, 0) == tables.MISSING
