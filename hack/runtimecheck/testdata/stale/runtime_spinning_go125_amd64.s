// A copy of the shape of gVisor's pkg/sync before Go 1.26 support (test
// data for TestInspectFindsAStaleCopy; never built).

//go:build amd64 && go1.25

#include "textflag.h"

#define NMSPINNING_OFFSET 100

TEXT ·addrOfSpinning(SB),NOSPLIT|NOFRAME,$0-8
	LEAQ runtime·sched(SB), AX
	ADDQ $NMSPINNING_OFFSET, AX
	MOVQ AX, ret+0(FP)
	RET
