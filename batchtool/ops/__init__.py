"""Operations: stratify, resample, shuffle, bucket, segment; each a plan plus pure per-chunk functions."""
