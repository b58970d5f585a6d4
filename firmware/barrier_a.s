; barrier_a.s - PPU 0 of a two-PPU pair that meets at a BARRIER (with firmware/barrier_b.s).
;
; Run with:  qlink sim --ppus 2 firmware/barrier_a.s firmware/barrier_b.s --json result.json
; Assemble alone with:  qlink asm --ppus 2 firmware/barrier_a.s (a build of two PPUs)
;
; PPU 0 measures its qubit first; PPU 1 (barrier_b.s) waits at the BARRIER meanwhile. A PPU
; reaches a BARRIER when its core does (the core runs ahead of the timeline), so this one gets
; there only when its measurement's result lands: the BEQ below waits for r1. Both then leave
; the BARRIER in the same DTD cycle with t = now + SLACK on each, and the drive pulses and
; markers that follow at equal offsets start in the same cycle on both PPUs: a simultaneous
; operation across two pulse processors, whatever the first PPU's measurement took.
;
; Timeline (DTD cycles at 250 MHz, 4 ns each; t starts at the trigger's START_TIME):
;   t=0      pi pulse on this PPU's qubit (it ends in |1>)
;   t=64     readout window of 100 cycles -> r1 (1)
;   ...      BEQ waits for r1, then the BARRIER: PPU 1 is already there, both leave together
;   now+64   marker 0 for 8 cycles and a pi/2 pulse, on both PPUs in the same cycle

.equ DRIVE, 0
.equ READOUT, 0
.equ PULSE, 64
.equ WINDOW, 400ns
.equ SLACK, 64              ; cycles from the release to the common events: time to queue them
.equ BOTH, 0b11             ; PPUs 0 and 1

.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0

        play DRIVE, gauss, amp=1.0
        wait PULSE
        acquire READOUT, r1, window=WINDOW, threshold=0
        beq r1, 0, meet         ; waits for the result: the core reaches the BARRIER after it
meet:
        barrier BOTH, SLACK
        marker 0, duration=8
        play DRIVE, gauss, amp=0.5
        wait PULSE
        end
