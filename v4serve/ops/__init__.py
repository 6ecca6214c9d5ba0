"""Ops: one op per file, each a readable torch reference, its Triton kernel(s) and one dispatching
public function (`impl="auto"|"torch"|"triton"`; auto = Triton on CUDA tensors, torch otherwise)."""
