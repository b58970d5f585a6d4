; rabi.s - a Rabi amplitude sweep: P(1) against the drive amplitude, shot by shot.
;
; Run with:  qlink sim firmware/rabi.s --json rabi.json
;
; For each amplitude A of 0.0, 0.2, ..., 1.0: SHOTS shots of a 64-sample gaussian at A, then a
; readout into r1; after each shot, active reset (a pi pulse when the readout gave 1) leaves the
; qubit in |0> for the next one, so shots follow each other without waiting out T1. The
; simulation's qubit model makes amplitude 1.0 of this gaussian a pi pulse (its calibration), so
; P(1) = sin^2(pi A / 2): 0, 0.10, 0.35, 0.65, 0.90, 1. The JSON's measurements, in order, are
; SHOTS per amplitude.
;
; Timing: the core runs ahead of the timeline. BEQ waits for the readout's result; then SYNC
; re-anchors t just after now, and the reset pulse (if any) is queued from there; the next
; shot's pulse starts at t, after the reset pulse has ended (a SYNC there would pull t back
; into the reset pulse, which the next PLAY would cut short).
;
; The ISA has no amplitude from a register yet: each amplitude is a block of its own; the shots
; of a block are a counted loop (r4).

.equ DRIVE, 0
.equ READOUT, 0
.equ PULSE, 64              ; samples (cycles at one sample per cycle)
.equ WINDOW, 25             ; readout window, cycles
.equ SHOTS, 12              ; shots per amplitude

.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0

        set r4, SHOTS
amp0:  play DRIVE, gauss, amp=0.0
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero0        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next0
zero0: sync 32
next0: add r4, r4, -1
        bne r4, 0, amp0
        set r4, SHOTS
amp1:  play DRIVE, gauss, amp=0.2
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero1        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next1
zero1: sync 32
next1: add r4, r4, -1
        bne r4, 0, amp1
        set r4, SHOTS
amp2:  play DRIVE, gauss, amp=0.4
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero2        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next2
zero2: sync 32
next2: add r4, r4, -1
        bne r4, 0, amp2
        set r4, SHOTS
amp3:  play DRIVE, gauss, amp=0.6
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero3        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next3
zero3: sync 32
next3: add r4, r4, -1
        bne r4, 0, amp3
        set r4, SHOTS
amp4:  play DRIVE, gauss, amp=0.8
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero4        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next4
zero4: sync 32
next4: add r4, r4, -1
        bne r4, 0, amp4
        set r4, SHOTS
amp5:  play DRIVE, gauss, amp=1.0
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, zero5        ; waits for the result
        sync 32
        play DRIVE, gauss, amp=1.0      ; active reset: |1> -> |0>
        wait PULSE
        jmp next5
zero5: sync 32
next5: add r4, r4, -1
        bne r4, 0, amp5
        end
