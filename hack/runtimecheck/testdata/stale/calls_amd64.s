// Assembly that only calls runtime functions (test data; never built).

TEXT ·enter(SB),$0-0
	CALL	runtime·entersyscall(SB)
	JMP	runtime·exitsyscall(SB)
