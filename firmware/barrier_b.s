; barrier_b.s - PPU 1 of a two-PPU pair that meets at a BARRIER (with firmware/barrier_a.s).
;
; Run with:  qlink sim --ppus 2 firmware/barrier_a.s firmware/barrier_b.s --json result.json
; Assemble alone with:  qlink asm --ppus 2 firmware/barrier_b.s (a build of two PPUs)
;
; This PPU reaches the BARRIER at once and waits there (the core, not the timeline) until
; PPU 0 has measured its qubit and arrived too; then both re-anchor t at the same cycle and
; start their marker and pi/2 pulse together. Its own qubit is measured after that.

.equ DRIVE, 0
.equ READOUT, 0
.equ PULSE, 64
.equ WINDOW, 400ns
.equ SLACK, 64
.equ BOTH, 0b11

.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0

        barrier BOTH, SLACK
        marker 0, duration=8
        play DRIVE, gauss, amp=0.5
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        wait WINDOW
        end
