"""How each lab's functions plug into the real system (engine, ring, rotation, simulator)."""
