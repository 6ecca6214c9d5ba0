"""DeepSeek-V4 modules and weight loading."""
