"""Hand schedules for x86 (AVX2 / AVX-512)."""
