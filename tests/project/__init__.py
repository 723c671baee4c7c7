"""The project as a whole: import layers, test markers, packaging, and docs that name tests."""
