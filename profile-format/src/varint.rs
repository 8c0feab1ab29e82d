//! LEB128 unsigned varints, the integer encoding of profile bodies.
